"""The TPU VM runner (kind ``tpu``): a Cloud TPU node per attempt (``projects.locations.nodes``).

The node is named after the attempt (RFC 1035, at most 63 characters), labelled with the
daemon's root, the runner kind (``bastion-runner: tpu``), the attempt's name
(``bastion-attempt-name``), the job and the attempt number, and runs the agent on every worker
from its startup script (:mod:`bastion.runners.startup`); the daemon never connects to it and
learns how the job goes from the agents' records in the bucket
(:class:`bastion.runners.remote.RemoteRecords`).

Settings: those of :mod:`bastion.runners.cloud`, plus ``runtime_version`` (default by family:
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
  (:meth:`bastion.runners.cloud.CloudRunner.create_failed`), so requeued attempts move to the
  next zone and then wait instead of recreating at once. Operation still running:
  PROVISIONING; else the node went away: what the agents reported, or LOST;
- CREATING: PROVISIONING;
- READY: the agents' records; RUNNING, "waiting for workers to start (k of N)" while some
  have not started, FAILED (retryable) once one has not within ``start_timeout_seconds``
  (:meth:`bastion.runners.cloud.CloudRunner.up`);
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

from bastion.runners.base import Attempt, Handle, Observation, Owned, Phase, RunnerError
from bastion.runners.cloud import CloudRunner, build_client, labels_for

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
    """Worker VMs per slice (cloud.md 1.6): v2/v3/v4/v5p count TensorCores, 8 per host;
    v5litepod/v6e count chips, one host up to 8 chips, 4 per host beyond."""
    m = _TYPE.fullmatch(acc_type)
    assert m, acc_type
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        return 1 if n <= 8 else n // 4
    return max(1, n // 8)


class TpuRunner(CloudRunner):
    kind = "tpu"
    resource_noun = "TPU node"
    api_env = "BASTION_TPU_API_ENDPOINT"

    def _build(self, credentials: str | None) -> Any:
        return build_client("tpu", "v2", self.endpoint, credentials).projects().locations()

    def _parent(self, zone: str) -> str:
        return f"projects/{self.project}/locations/{zone}"

    def _list_zone(self, zone: str) -> list[dict]:
        nodes, token = [], None
        while True:
            request = self.client.nodes().list(parent=self._parent(zone), pageSize=self.page_size,
                                               pageToken=token)  # fmt: skip
            page = self.execute(request)
            nodes += page.get("nodes") or []
            if not (token := page.get("nextPageToken")):
                return nodes

    def _workers(self, attempt: Attempt) -> int:
        if int(attempt.options.get("num_replicas", 1)) > 1:  # multislice: queued resources only
            raise RunnerError(
                "num_replicas > 1 (multislice) runs as queued resources: use the runner kind "
                "tpu-qr (launch --instance_type with --num_replicas picks it)"
            )
        return hosts(accelerator_type(attempt.options))

    def _create(self, attempt: Attempt, zone: str, workers: int) -> str | None:
        body = self.node_body(attempt, self.script(attempt, workers))
        request = self.client.nodes().create(parent=self._parent(zone), nodeId=attempt.name,
                                             body=body)  # fmt: skip
        return self.execute(request, retries=0).get("name")

    def node_body(self, attempt: Attempt, script: str) -> dict[str, Any]:
        """A Node: type, runtime, labels, the startup script, spot, network, account."""
        acc = accelerator_type(attempt.options)
        family = acc.split("-")[0]
        runtime = (attempt.options.get("runtime_version") or self.settings.get("runtime_version")
                   or _RUNTIME.get(family, "tpu-ubuntu2204-base"))  # fmt: skip
        body: dict[str, Any] = {
            "acceleratorType": acc,
            "runtimeVersion": runtime,
            "labels": labels_for(attempt, self.tag, self.kind),
            "metadata": {"startup-script": script, "bastion-job-name": attempt.job},
        }
        kind, _ = self.capacity(attempt)
        if kind == "spot":
            body["schedulingConfig"] = {"spot": True}
        elif kind == "reserved":
            body["schedulingConfig"] = {"reserved": True}
        network = {k: self.settings[k] for k in ("network", "subnetwork") if self.settings.get(k)}
        if network:
            body["networkConfig"] = {**network, "enableExternalIps": False}
        if self.settings.get("service_account"):
            body["serviceAccount"] = {
                "email": self.settings["service_account"],
                "scope": ["https://www.googleapis.com/auth/cloud-platform"],
            }
        return body

    def _quota_reason(self, error: HttpError) -> str | None:
        """A 429 with QuotaFailure details (a rate limit has none): the quota's message."""
        details = error.error_details if isinstance(error.error_details, list) else []
        for detail in details:
            if isinstance(detail, dict) and detail.get("@type", "").endswith("QuotaFailure"):
                violations = detail.get("violations") or [{}]
                text = violations[0].get("description") or str(error.reason)
                m = re.search(r"Quota '([^']+)'", text)
                return m.group(1) if m else text
        return None

    def job_of(self, resource: dict) -> str | None:
        return (resource.get("metadata") or {}).get("bastion-job-name")

    def _legacy_ours(self, resource: dict) -> bool:
        """A node of this root without a runner label (an older daemon made it) is this
        runner's only if no queued resource made it: a node with ``queuedResource`` (the
        API's back-pointer) or ``multisliceNode`` set belongs to its queued resource, which
        the ``tpu-qr`` runner owns and deletes (nodes first); its name (``<attempt>-s<i>``)
        is no attempt, and deleting it would kill that attempt's running slice."""
        return not (resource.get("queuedResource") or resource.get("multisliceNode"))

    # -- poll --------------------------------------------------------------------------------
    def poll(self, handle: Handle) -> Observation:
        node = self.listing(handle["zone"]).get(handle["name"])
        if node is None:
            return self._absent(handle)
        state = node.get("state", "STATE_UNSPECIFIED")
        if state == "READY":
            return self.up(handle)
        if state in ("PREEMPTED", "TERMINATED"):
            return self.preempted(handle, f"node {handle['name']} {state} in {handle['zone']}")
        if state == "DELETING":
            return self.gone(handle, f"node {handle['name']} is being deleted")
        if state == "CREATING":
            return Observation(Phase.PROVISIONING, f"node {state} in {handle['zone']}")
        health = node.get("health", "")
        return self.transient(handle, state, "" if health in ("", "HEALTHY") else health)

    def _absent(self, handle: Handle) -> Observation:
        op_name = handle.get("op")
        if not op_name:
            record = self.store.read_provision(handle["job"], handle["name"]) or {}
            op_name = record.get("op")
        if op_name:
            try:
                op = self.execute(self.client.operations().get(name=op_name))
            except HttpError as e:
                if e.status_code != 404:
                    raise
                op = {"done": True}
            if not op.get("done"):
                return Observation(Phase.PROVISIONING, f"creating in {handle['zone']}")
            error = op.get("error")
            if error:
                return self._create_error(handle, error)
        return self.gone(handle, f"node {handle['name']} is gone from {handle['zone']}")

    def _create_error(self, handle: Handle, error: dict) -> Observation:
        """What a failed create operation (a ``google.rpc.Status``) means for the attempt."""
        code, message = error.get("code"), str(error.get("message", ""))
        zone = handle["zone"]
        if code in _STOCKOUT_CODES:
            return self.stockout(handle, message)
        if code == 3 and "preempt" in message.lower():  # SkyPilot's "preempted while creating"
            return self.create_failed(handle, f"preempted while creating in {zone}: {message}",
                                      Phase.PREEMPTED)  # fmt: skip
        if code == 3:  # INVALID_ARGUMENT: the request is wrong; a new attempt would be too
            return Observation(Phase.FAILED, f"the TPU API refused to create node "
                               f"{handle['name']} in {zone}: {message}")  # fmt: skip
        return self.create_failed(handle, f"creating the node failed in {zone}: "
                                  f"error code {code}: {message}")  # fmt: skip

    # -- stop, delete, list ------------------------------------------------------------------
    def _going(self, resource: dict) -> bool:
        return resource.get("state") == "DELETING"

    def _request_delete(self, handle: Handle) -> None:
        name = f"{self._parent(handle['zone'])}/nodes/{handle['name']}"
        try:
            self.execute(self.client.nodes().delete(name=name))
        except HttpError as e:
            if e.status_code != 404:
                raise
        self.deleted(handle["zone"])

    def _list_resources(self) -> list[Owned]:
        owned = []
        for zone in self.zones:
            for node in self.listing(zone).values():
                workers = len(node.get("networkEndpoints") or []) or hosts(
                    node.get("acceleratorType", "v4-8")
                )
                finished = node.get("state") in ("PREEMPTED", "TERMINATED", "DELETING")
                owned.append(self.owned(node, zone, workers, finished))
        return owned
