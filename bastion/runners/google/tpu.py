"""The TPU VM runner (kind ``tpu``): a Cloud TPU node per attempt (``projects.locations.nodes``).

The node is named after the attempt (RFC 1035, at most 63 characters), labelled with the
daemon's root, the runner kind (``bastion-runner: tpu``), the attempt's name
(``bastion-attempt-name``), the job and the attempt number, and runs the agent on every worker
from its startup script (:mod:`bastion.runners.startup`); the daemon never connects to it and
learns how the job goes from the agents' records in the bucket
(:mod:`bastion.runners.kit.channel`).

Settings: those of :mod:`bastion.runners.google.zonal`, plus ``runtime_version`` (default by family:
``tpu-ubuntu2204-base``, v5p ``v2-alpha-tpuv5``, v5litepod ``v2-alpha-tpuv5-lite``, v6e
``v2-alpha-tpuv6e``) and ``api_endpoint`` defaulting to ``$BASTION_TPU_API_ENDPOINT``.
Per-job options: ``accelerator_type`` (``v4-32``) or ``instance_type`` (AXLearn's
``tpu-v4-32``), ``runtime_version``, ``spot``.

Poll, from the zone's listing (one call per zone per cycle for all attempts):

- node absent: the create operation says why: code 8/9 = stockout (FAILED retryable, zone
  blocked); code 3 whose message speaks of a preemption = preempted while creating
  (PREEMPTED, retryable); any other code 3 (INVALID_ARGUMENT: the request itself is wrong) =
  FAILED, not retryable, with the API's message; any other error (e.g. 13 INTERNAL) = FAILED
  retryable. A failed create other than a stockout backs its zone off exponentially
  (:class:`bastion.runners.kit.failover.Failover`), so requeued attempts move to the
  next zone and then wait instead of recreating at once. Operation still running:
  PROVISIONING; else the node went away: what the agents reported, or LOST;
- CREATING: PROVISIONING;
- READY: the agents' records; RUNNING, "waiting for workers to start (k of N)" while some
  have not started, FAILED (retryable) once one has not within ``start_timeout_seconds``
  (:meth:`bastion.runners.kit.channel.AgentChannel.up`);
- REPAIRING (a maintenance event: ``health`` UNHEALTHY_MAINTENANCE; the workers' startup
  script runs again once it is READY, and the agent never starts the command twice),
  RESTARTING, STARTING and other transient states: the agents' records once any worker
  started (RUNNING, the state named in the reason), else PROVISIONING;
- PREEMPTED/TERMINATED: PREEMPTED, retryable (a preempted node is deleted, never reused);
- DELETING: the node is going (we stopped it): the agents' records, or LOST.

Owned (``list_owned``, which the daemon's sweep deletes when no job names them): the nodes
labelled with this root, runner ``tpu`` and their own name as the attempt name. Nodes that a
queued resource made (runner ``tpu-qr``, or an older daemon's unlabelled ones carrying the
API's ``queuedResource`` back-pointer) are the ``tpu-qr`` runner's, never this one's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from googleapiclient.errors import HttpError

from bastion.runners.base import Attempt, AttemptPhase, Handle, Observation, RunnerError
from bastion.runners.google.api import GoogleApi, build_client, labels_for, quota_failure
from bastion.runners.google.zonal import ZonalConfig, ZonalProvisioner, ZonalRunner

API_ENV = "BASTION_TPU_API_ENDPOINT"
_TYPE = re.compile(r"(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)")
_RUNTIME = {"v5p": "v2-alpha-tpuv5", "v5litepod": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}
_STOCKOUT_CODES = frozenset({8, 9})  # RESOURCE_EXHAUSTED, FAILED_PRECONDITION (reservation)


def from_settings(settings: Mapping[str, Any]) -> TpuRunner:
    return TpuRunner(settings)


def accelerator_type(options: Mapping[str, Any]) -> str:
    """``v4-32`` from ``accelerator_type`` or AXLearn's ``instance_type`` ``tpu-v4-32``."""
    text = str(options.get("accelerator_type") or options.get("instance_type") or "")
    text = text.removeprefix("tpu-")
    if not _TYPE.fullmatch(text):
        raise RunnerError(f"the tpu runner needs options accelerator_type like v4-32, not {text!r}")
    return text


def hosts(acc_type: str) -> int:
    """Worker VMs per slice (Cloud TPU's documentation): v2/v3/v4/v5p count TensorCores, 8 per host;
    v5litepod/v6e count chips, one host up to 8 chips, 4 per host beyond."""
    m = _TYPE.fullmatch(acc_type)
    assert m, acc_type
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        return 1 if n <= 8 else n // 4
    return max(1, n // 8)


def tpu_client(config: ZonalConfig) -> Any:
    """``projects.locations`` of the Cloud TPU API v2 (nodes, queued resources, operations)."""
    credentials = config.settings.get("credentials")
    return build_client("tpu", "v2", config.endpoint, credentials).projects().locations()


def parent(config: ZonalConfig, zone: str) -> str:
    return f"projects/{config.project}/locations/{zone}"


def node_body(flow: ZonalProvisioner, attempt: Attempt, script: str) -> dict[str, Any]:
    """A Node: type, runtime, labels, the startup script, capacity, network, account."""
    settings = flow.config.settings
    acc = accelerator_type(attempt.options)
    family = acc.split("-")[0]
    runtime = (
        attempt.options.get("runtime_version")
        or settings.get("runtime_version")
        or _RUNTIME.get(family, "tpu-ubuntu2204-base")
    )
    body: dict[str, Any] = {
        "acceleratorType": acc,
        "runtimeVersion": runtime,
        "labels": labels_for(attempt, flow.tag, flow.kind),
        "metadata": {"startup-script": script, "bastion-job-name": attempt.job},
    }
    kind, _ = flow.capacity(attempt)
    if kind == "spot":
        body["schedulingConfig"] = {"spot": True}
    elif kind == "reserved":
        body["schedulingConfig"] = {"reserved": True}
    network = {k: settings[k] for k in ("network", "subnetwork") if settings.get(k)}
    if network:
        body["networkConfig"] = {**network, "enableExternalIps": False}
    if settings.get("service_account"):
        body["serviceAccount"] = {
            "email": settings["service_account"],
            "scope": ["https://www.googleapis.com/auth/cloud-platform"],
        }
    return body


class TpuNodes:
    """The ``tpu`` runner's provider: ``projects.locations.nodes``, one node per attempt."""

    noun = "TPU node"

    def __init__(self, config: ZonalConfig, api: GoogleApi) -> None:
        self.config, self.api = config, api

    def list_zone(self, zone: str) -> list[dict]:
        nodes = self.api.client.nodes()
        return self.api.paginate(
            lambda token: nodes.list(
                parent=parent(self.config, zone), pageSize=self.config.page_size, pageToken=token
            ),
            "nodes",
        )

    def legacy_ours(self, resource: dict) -> bool:
        """A node of this root without a runner label (an older daemon made it) is this
        runner's only if no queued resource made it: a node with ``queuedResource`` (the
        API's back-pointer) or ``multisliceNode`` set belongs to its queued resource, which
        the ``tpu-qr`` runner owns and deletes (nodes first); its name (``<attempt>-s<i>``)
        is no attempt, and deleting it would kill that attempt's running slice."""
        return not (resource.get("queuedResource") or resource.get("multisliceNode"))

    def job_of(self, resource: dict) -> str | None:
        return (resource.get("metadata") or {}).get("bastion-job-name")

    def workers(self, attempt: Attempt) -> int:
        if int(attempt.options.get("num_replicas", 1)) > 1:  # multislice: queued resources only
            raise RunnerError(
                "num_replicas > 1 (multislice) runs as queued resources: use the runner kind "
                "tpu-qr (launch --instance_type with --num_replicas picks it)"
            )
        return hosts(accelerator_type(attempt.options))

    def create(
        self, flow: ZonalProvisioner, attempt: Attempt, zone: str, workers: int
    ) -> str | None:
        body = node_body(flow, attempt, flow.script(attempt, workers))
        request = self.api.client.nodes().create(
            parent=parent(self.config, zone), nodeId=attempt.name, body=body
        )
        return self.api.execute(request, retries=0).get("name")

    def quota_reason(self, error: HttpError) -> str | None:
        return quota_failure(error)

    # -- poll ----------------------------------------------------------------------------------
    def poll(self, flow: ZonalProvisioner, handle: Handle) -> Observation:
        zone, name = handle["zone"], handle["name"]
        node = flow.listing(zone).get(name)
        if node is None:
            return self._absent(flow, handle)
        state = node.get("state", "STATE_UNSPECIFIED")
        if state == "READY":
            return flow.up(handle)
        if state in ("PREEMPTED", "TERMINATED"):
            return flow.channel.preempted(handle, f"node {name} {state} in {zone}")
        if state == "DELETING":
            return flow.channel.gone(handle, f"node {name} is being deleted")
        if state == "CREATING":
            return Observation(AttemptPhase.PROVISIONING, f"node {state} in {zone}")
        health = node.get("health", "")
        return flow.transient(handle, state, "" if health in ("", "HEALTHY") else health)

    def _absent(self, flow: ZonalProvisioner, handle: Handle) -> Observation:
        if op_name := flow.provision_op(handle):
            try:
                op = self.api.execute(self.api.client.operations().get(name=op_name))
            except HttpError as e:
                if e.status_code != 404:
                    raise
                op = {"done": True}
            if not op.get("done"):
                return Observation(AttemptPhase.PROVISIONING, f"creating in {handle['zone']}")
            if error := op.get("error"):
                return self._create_error(flow, handle, error)
        return flow.channel.gone(handle, f"node {handle['name']} is gone from {handle['zone']}")

    def _create_error(self, flow: ZonalProvisioner, handle: Handle, error: dict) -> Observation:
        """What a failed create operation (a ``google.rpc.Status``) means for the attempt."""
        code, message = error.get("code"), str(error.get("message", ""))
        zone = handle["zone"]
        if code in _STOCKOUT_CODES:
            return flow.stockout(handle, message)
        if code == 3 and "preempt" in message.lower():  # SkyPilot's "preempted while creating"
            return flow.create_failed(
                handle, f"preempted while creating in {zone}: {message}", AttemptPhase.PREEMPTED
            )
        if code == 3:  # INVALID_ARGUMENT: the request is wrong; a new attempt would be too
            return Observation(
                AttemptPhase.FAILED,
                f"the TPU API refused to create node {handle['name']} in {zone}: {message}",
            )
        return flow.create_failed(
            handle, f"creating the node failed in {zone}: error code {code}: {message}"
        )

    # -- delete, list --------------------------------------------------------------------------
    def going(self, resource: dict) -> bool:
        return resource.get("state") == "DELETING"

    def request_delete(self, handle: Handle) -> None:
        name = f"{parent(self.config, handle['zone'])}/nodes/{handle['name']}"
        self.api.delete(self.api.client.nodes().delete(name=name))

    def inventory(self, resource: dict) -> tuple[int, bool]:
        workers = len(resource.get("networkEndpoints") or []) or hosts(
            resource.get("acceleratorType", "v4-8")
        )
        return workers, resource.get("state") in ("PREEMPTED", "TERMINATED", "DELETING")


class TpuRunner(ZonalRunner):
    """Kind ``tpu``: :class:`TpuNodes` in the zonal flow (it adds no behaviour of its own)."""

    kind = "tpu"

    def __init__(self, settings: Mapping[str, Any], client: Any = None) -> None:
        super().__init__(self.kind, settings, API_ENV, tpu_client, TpuNodes, client)
