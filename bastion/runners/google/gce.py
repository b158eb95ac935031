"""The GPU VM runner (kind ``gce``): one Compute Engine instance per attempt (``instances.insert``).

The instance is named after the attempt, labelled like a TPU node, and runs the agent from its
``startup-script`` metadata item. The insert carries ``requestId`` = uuid5 of the root and the
attempt's name, so a retried insert (a lost answer, a restarted daemon) is deduplicated by the
server instead of creating a second VM or failing on the name.

Settings: those of :mod:`bastion.runners.google.zonal`, plus ``image`` (the boot disk's source
image, default a Deep Learning VM CUDA image family), ``disk_gb`` (default 200), ``max_run_seconds``
and ``api_endpoint`` defaulting to ``$BASTION_COMPUTE_API_ENDPOINT`` (its form ends in
``/compute/v1/``). Per-job options: ``machine_type`` (``a3-highgpu-8g``) or ``instance_type``
(``gpu-a3-highgpu-8g``, ``gpu-g2-standard-8``, or AXLearn's ``gpu-h100-80gb-8``: see
:func:`gpu_machine`), ``accelerator`` + ``accelerator_count`` (N1 only: the other GPU families
have their GPUs built in, Google's API documentation), ``spot``.

``max_run_seconds`` (default 604800, 7 days; 0: none) is a dead man's switch on every VM:
``scheduling.maxRunDuration`` with ``instanceTerminationAction: DELETE``, so the VM deletes
itself at that age even if every daemon is gone and nothing is left billing. A VM that the
switch ended (gone, or TERMINATED, at least that old, with no ``compute.instances.preempted``
operation, and not stopped by us) fails its job, not retryable, with a reason naming
``max_run_seconds``: a new attempt would run into the same limit. Jobs that run longer need a
higher setting.

Spot VMs use ``provisioningModel: SPOT`` with ``instanceTerminationAction: DELETE`` (a preempted
VM is never reused, so nothing is left billing), ``onHostMaintenance: TERMINATE`` and no
automatic restart (GPU VMs cannot live-migrate).

Poll, from the zone's listing: PROVISIONING/STAGING/PENDING: PROVISIONING; REPAIRING: the
agents' records once any started, else PROVISIONING; RUNNING: the agents' records (with the
deadline ``start_timeout_seconds`` for the worker to start; the failure carries the last
``startup-script`` lines of the VM's serial port output); absent with
a failed insert operation: a stockout (ZONE_RESOURCE_POOL_EXHAUSTED: FAILED retryable, zone
blocked), a quota (region blocked), UNSUPPORTED_OPERATION (a spot VM preempted while it was
being created: PREEMPTED, retryable) or any other error (FAILED retryable), the last two
backing the zone off exponentially (:class:`bastion.runners.kit.failover.Failover`);
absent, STOPPING or TERMINATED: a ``compute.instances.preempted`` operation for the instance
means PREEMPTED; past ``max_run_seconds``, the dead man's switch (FAILED); otherwise what the
agents reported, or LOST (requeued).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from googleapiclient.errors import HttpError

from bastion.runners.base import Attempt, AttemptPhase, Handle, Observation, RunnerError
from bastion.runners.google.api import GoogleApi, build_client, labels_for, region_of
from bastion.runners.google.zonal import ZonalConfig, ZonalProvisioner, ZonalRunner
from bastion.runners.kit.channel import last_lines

IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
# AXLearn's GPU names (system_characteristics.py) for the machine types they mean
_AXLEARN = {
    "a100-40gb-1": "a2-highgpu-1g",
    "a100-40gb-8": "a2-highgpu-8g",
    "h100-80gb-8": "a3-highgpu-8g",
    "h100-mega-80gb-8": "a3-megagpu-8g",
    "h200-141gb-8": "a3-ultragpu-8g",
}
_STOCKOUT = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "insufficientCapacity",
        "RESOURCE_NOT_READY",
    }
)
_PROVISIONING = frozenset({"PROVISIONING", "STAGING", "PENDING"})
MAX_RUN_SECONDS = 7 * 24 * 3600  # the default dead man's switch
# GPUs of the G2 machine types (one to eight L4s, Google's API documentation)
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_GONE = frozenset({"STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED", "DEPROVISIONING"})
_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def from_settings(settings: Mapping[str, Any]) -> GceRunner:
    return GceRunner(settings)


def gpus_of(machine: str) -> int | None:
    """The GPUs a GPU machine type has built in (``a3-highgpu-8g``: 8, ``g2-standard-24``:
    2), or None for a type without (N1 takes ``accelerator``) or one not known."""
    if m := re.fullmatch(r"a\d+-[a-z]+gpu-(\d+)g(?:-[a-z0-9]+)?", machine):
        return int(m.group(1))
    if m := re.fullmatch(r"g2-standard-(\d+)", machine):
        return _G2_GPUS.get(int(m.group(1)))
    return None


def gpu_machine(instance_type: str) -> tuple[str, int] | None:
    """AXLearn's GPU instance type (``gpu-a3-highgpu-8g``, ``gpu-h100-80gb-8``,
    ``gpu-g2-standard-8``) as (machine type, GPUs), or None when it names no GPU machine."""
    if not instance_type.startswith("gpu-"):
        return None
    machine = instance_type.removeprefix("gpu-")
    machine = _AXLEARN.get(machine, machine)
    count = gpus_of(machine)
    return None if count is None else (machine, count)


def machine_type(options: Mapping[str, Any]) -> str:
    text = str(options.get("machine_type") or options.get("instance_type") or "")
    text = text.removeprefix("gpu-")
    text = _AXLEARN.get(text, text)
    if not re.fullmatch(r"[a-z][a-z0-9]*-[a-z0-9-]+", text):
        raise RunnerError(
            f"the gce runner needs options machine_type like a3-highgpu-8g, not {text!r}"
        )
    return text


def request_id(root: str, name: str, verb: str = "insert") -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"bastion:{root}/{name}/{verb}"))


def compute_client(config: ZonalConfig) -> Any:
    return build_client("compute", "v1", config.endpoint, config.settings.get("credentials"))


def instance_body(flow: ZonalProvisioner, attempt: Attempt, zone: str, max_run: int) -> dict:
    """An instance: machine type, labels, scheduling (spot, dead man's switch), boot disk,
    network, the startup script, GPUs (N1), reservation, account."""
    settings = flow.config.settings
    machine = machine_type(attempt.options)
    scheduling: dict[str, Any] = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
    kind, reservation = flow.capacity(attempt)
    if kind == "spot":
        scheduling.update(provisioningModel="SPOT", instanceTerminationAction="DELETE")
    if max_run > 0:
        scheduling.update(
            instanceTerminationAction="DELETE", maxRunDuration={"seconds": str(max_run)}
        )
    nic: dict[str, Any] = {"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}
    nic.update({k: settings[k] for k in ("network", "subnetwork") if settings.get(k)})
    disk = {
        "sourceImage": settings.get("image") or IMAGE,
        "diskSizeGb": str(int(settings.get("disk_gb", 200))),
    }
    body: dict[str, Any] = {
        "name": attempt.name,
        "machineType": f"zones/{zone}/machineTypes/{machine}",
        "labels": labels_for(attempt, flow.tag, flow.kind),
        "scheduling": scheduling,
        "disks": [{"boot": True, "autoDelete": True, "initializeParams": disk}],
        "networkInterfaces": [nic],
        "metadata": {
            "items": [
                {"key": "startup-script", "value": flow.script(attempt, 1)},
                {"key": "bastion-job-name", "value": attempt.job},
                {"key": "install-nvidia-driver", "value": "True"},
            ]
        },
    }
    if gpu := attempt.options.get("accelerator"):  # N1 only
        count = int(attempt.options.get("accelerator_count", 1))
        body["guestAccelerators"] = [
            {"acceleratorType": f"zones/{zone}/acceleratorTypes/{gpu}", "acceleratorCount": count}
        ]
    if kind == "reserved":  # Google's API documentation: a named reservation, or any that fits
        body["reservationAffinity"] = (
            {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": [reservation],
            }
            if reservation
            else {"consumeReservationType": "ANY_RESERVATION"}
        )
    if settings.get("service_account"):
        body["serviceAccounts"] = [{"email": settings["service_account"], "scopes": _SCOPES}]
    return body


class Instances:
    """The ``gce`` runner's provider: Compute Engine ``instances``, one VM per attempt."""

    noun = "VM"

    def __init__(self, config: ZonalConfig, api: GoogleApi) -> None:
        self.config, self.api = config, api
        self.max_run_seconds = int(config.settings.get("max_run_seconds", MAX_RUN_SECONDS) or 0)
        # googleapiclient builds a collection's every method from the discovery document on
        # each ``client.instances()`` (some 35 ms of CPU for Compute's): each is built once.
        # Requests made from it carry no connection (``execute`` passes the thread's own).
        self.instances = api.client.instances()
        self.operations = api.client.zoneOperations()

    def list_zone(self, zone: str) -> list[dict]:
        return self.api.paginate(
            lambda token: self.instances.list(
                project=self.config.project,
                zone=zone,
                filter=f'labels.bastion-root="{self.config.tag}"',
                maxResults=self.config.page_size,
                pageToken=token,
            ),
            "items",
        )

    def job_of(self, resource: dict) -> str | None:
        items = (resource.get("metadata") or {}).get("items") or []
        return next((i.get("value") for i in items if i.get("key") == "bastion-job-name"), None)

    def workers(self, attempt: Attempt) -> int:
        return 1

    def create(
        self, flow: ZonalProvisioner, attempt: Attempt, zone: str, workers: int
    ) -> str | None:
        request = self.instances.insert(
            project=self.config.project,
            zone=zone,
            body=instance_body(flow, attempt, zone, self.max_run_seconds),
            requestId=request_id(self.config.root, attempt.name),
        )
        return self.api.execute(request, retries=0).get("name")

    def quota_reason(self, error: HttpError) -> str | None:
        details = error.error_details if isinstance(error.error_details, list) else []
        if error.status_code == 403 and any(
            isinstance(d, dict) and d.get("reason") == "quotaExceeded" for d in details
        ):
            m = re.search(r"Quota '([^']+)'", str(details[0].get("message", "")))
            return m.group(1) if m else "quota"
        return None

    # -- poll ----------------------------------------------------------------------------------
    def poll(self, flow: ZonalProvisioner, handle: Handle) -> Observation:
        zone, name = handle["zone"], handle["name"]
        inst = flow.listing(zone).get(name)
        status = inst.get("status", "") if inst else "ABSENT"
        if status == "RUNNING":
            return flow.up(handle)
        if status in _PROVISIONING:
            return Observation(AttemptPhase.PROVISIONING, f"instance {status} in {zone}")
        if status == "REPAIRING":
            return flow.transient(handle, status)
        # absent: a failed insert first (a spot VM preempted while being created has a
        # preempted operation too, but it never ran: its zone backs off)
        if inst is None and (failed := self._insert_failed(flow, handle)) is not None:
            return failed
        if self._was_preempted(handle):
            return flow.channel.preempted(handle, f"instance {name} preempted in {zone}")
        if (switched := self._switched_off(flow, handle, status)) is not None:
            return switched
        return flow.channel.gone(handle, f"instance {name} {status.lower()}")

    def _switched_off(
        self, flow: ZonalProvisioner, handle: Handle, status: str
    ) -> Observation | None:
        """The dead man's switch ended the VM: gone or stopped, not preempted, not by us, at
        least ``max_run_seconds`` after its insert was issued (the VM's own run began later,
        so a VM younger than that by this count cannot have reached its limit)."""
        if self.max_run_seconds <= 0 or status not in ("ABSENT", "STOPPING", "TERMINATED"):
            return None
        if flow.failover.was_stopped(handle["name"]):
            return None
        created = flow.created(handle)
        if created is None or time.time() - created < self.max_run_seconds:
            return None
        why = (
            f"VM {handle['name']} in {handle['zone']} reached max_run_seconds "
            f"({self.max_run_seconds} s), its dead man's switch (scheduling.maxRunDuration): "
            "raise the gce runner's max_run_seconds setting for longer jobs"
        )
        return flow.channel.ended(handle, Observation(AttemptPhase.FAILED, why))

    def _was_preempted(self, handle: Handle) -> bool:
        """A ``compute.instances.preempted`` op for this instance (asked only once the
        instance is stopping or gone, so it costs nothing in the steady state)."""
        link = (
            f"https://www.googleapis.com/compute/v1/projects/{self.config.project}/zones/"
            f"{handle['zone']}/instances/{handle['name']}"
        )
        request = self.operations.list(
            project=self.config.project,
            zone=handle["zone"],
            filter=f'operationType="compute.instances.preempted" AND targetLink="{link}"',
        )
        return bool(self.api.execute(request).get("items"))

    def _insert_failed(self, flow: ZonalProvisioner, handle: Handle) -> Observation | None:
        if not (op_name := flow.provision_op(handle)):
            return None
        zone = handle["zone"]
        try:
            op = self.api.execute(
                self.operations.get(project=self.config.project, zone=zone, operation=op_name)
            )
        except HttpError as e:
            if e.status_code == 404:
                return None
            raise
        if op.get("status") != "DONE":
            return Observation(AttemptPhase.PROVISIONING, f"inserting in {zone}")
        errors = (op.get("error") or {}).get("errors") or []
        if not errors:
            return None
        code, message = errors[0].get("code", ""), errors[0].get("message", "")
        if code in _STOCKOUT:
            return flow.stockout(handle, message)
        if code == "QUOTA_EXCEEDED":
            why = f"quota exceeded in region {region_of(zone)}: {message}"
            flow.failover.quota(region_of(zone), why)
            return Observation(AttemptPhase.FAILED, why, retryable=True)
        if code == "UNSUPPORTED_OPERATION":  # observed when a spot VM is preempted while created
            return flow.create_failed(
                handle, f"preempted while creating in {zone}: {message}", AttemptPhase.PREEMPTED
            )
        return flow.create_failed(handle, f"insert failed in {zone}: error code {code}: {message}")

    def startup_output(self, handle: Handle, worker: int) -> str | None:
        """The ``startup-script`` lines of the VM's serial port output (``instances.
        getSerialPortOutput``, port 1: the guest agent's ``google_metadata_script_runner``
        prefixes each line the script prints with ``startup-script:``), Compute's own record
        of the boot, there even when the script could copy nothing to the bucket."""
        try:
            out = self.api.execute(
                self.instances.getSerialPortOutput(
                    project=self.config.project,
                    zone=handle["zone"],
                    instance=handle["name"],
                    port=1,
                )
            )
        except HttpError:
            out = {}
        marker = "startup-script: "
        lines = [
            line.split(marker, 1)[1]
            for line in str(out.get("contents") or "").splitlines()
            if marker in line
        ]
        return last_lines("\n".join(lines)) if lines else None

    # -- delete, list --------------------------------------------------------------------------
    def going(self, resource: dict) -> bool:
        return resource.get("status") == "STOPPING"  # a VM being deleted stops first

    def request_delete(self, handle: Handle) -> None:
        self.api.delete(
            self.instances.delete(
                project=self.config.project, zone=handle["zone"], instance=handle["name"]
            )
        )

    def inventory(self, resource: dict) -> tuple[int, bool]:
        return 1, resource.get("status") in _GONE


class GceRunner(ZonalRunner):
    """Kind ``gce``: :class:`Instances` in the zonal flow (no behaviour of its own)."""

    kind = "gce"

    def __init__(self, settings: Mapping[str, Any], client: Any = None) -> None:
        super().__init__(
            self.kind, settings, "BASTION_COMPUTE_API_ENDPOINT", compute_client, Instances, client
        )
