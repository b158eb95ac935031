"""The GPU VM runner (kind ``gce``): one Compute Engine instance per attempt (``instances.insert``).

The instance is named after the attempt, labelled like a TPU node, and runs the agent from its
``startup-script`` metadata item. The insert carries ``requestId`` = uuid5 of the root and the
attempt's name, so a retried insert (a lost answer, a restarted daemon) is deduplicated by the
server instead of creating a second VM or failing on the name.

Settings: those of :mod:`bastion.runners.cloud`, plus ``image`` (the boot disk's source image,
default a Deep Learning VM CUDA image family), ``disk_gb`` (default 200), ``max_run_seconds``
and ``api_endpoint`` defaulting to ``$BASTION_COMPUTE_API_ENDPOINT`` (its form ends in
``/compute/v1/``). Per-job options: ``machine_type`` (``a3-highgpu-8g``) or ``instance_type``
(``gpu-a3-highgpu-8g``, ``gpu-g2-standard-8``, or AXLearn's ``gpu-h100-80gb-8``: see
:func:`gpu_machine`), ``accelerator`` + ``accelerator_count`` (N1 only: the other GPU families
have their GPUs built in, cloud.md 2.2), ``spot``.

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
backing the zone off exponentially (:meth:`bastion.runners.cloud.CloudRunner.create_failed`);
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

from bastion.runners.base import Attempt, Handle, Observation, Owned, Phase, RunnerError
from bastion.runners.cloud import CloudRunner, build_client, labels_for, last_lines, region_of

IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
# AXLearn's GPU names (system_characteristics.py) for the machine types they mean
_AXLEARN = {"a100-40gb-1": "a2-highgpu-1g", "a100-40gb-8": "a2-highgpu-8g",
            "h100-80gb-8": "a3-highgpu-8g", "h100-mega-80gb-8": "a3-megagpu-8g",
            "h200-141gb-8": "a3-ultragpu-8g"}  # fmt: skip
_STOCKOUT = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                       "insufficientCapacity", "RESOURCE_NOT_READY"})  # fmt: skip
_PROVISIONING = frozenset({"PROVISIONING", "STAGING", "PENDING"})
MAX_RUN_SECONDS = 7 * 24 * 3600  # the default dead man's switch
# GPUs of the G2 machine types (one to eight L4s, cloud.md 2.2)
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_GONE = frozenset({"STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED", "DEPROVISIONING"})


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
        raise RunnerError(f"the gce runner needs options machine_type like a3-highgpu-8g, "
                          f"not {text!r}")  # fmt: skip
    return text


def request_id(root: str, name: str, verb: str = "insert") -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"bastion:{root}/{name}/{verb}"))


class GceRunner(CloudRunner):
    kind = "gce"
    resource_noun = "VM"
    api_env = "BASTION_COMPUTE_API_ENDPOINT"

    def __init__(self, settings: Mapping[str, Any], client: Any = None) -> None:
        super().__init__(settings, client)
        self.max_run_seconds = int(settings.get("max_run_seconds", MAX_RUN_SECONDS) or 0)
        self._collections: dict[str, Any] = {}

    def _build(self, credentials: str | None) -> Any:
        return build_client("compute", "v1", self.endpoint, credentials)

    # googleapiclient builds a collection's every method from the discovery document on each
    # ``client.instances()`` (some 35 ms of CPU for Compute's): build each collection once.
    # Requests made from it carry no connection (``execute`` passes the thread's own).
    def instances(self) -> Any:
        if self._collections.get("instances") is None:
            self._collections["instances"] = self.client.instances()
        return self._collections["instances"]

    def zone_operations(self) -> Any:
        if self._collections.get("zoneOperations") is None:
            self._collections["zoneOperations"] = self.client.zoneOperations()
        return self._collections["zoneOperations"]

    def _list_zone(self, zone: str) -> list[dict]:
        items, token = [], None
        while True:
            request = self.instances().list(
                project=self.project, zone=zone, filter=f'labels.bastion-root="{self.tag}"',
                maxResults=self.page_size, pageToken=token)  # fmt: skip
            page = self.execute(request)
            items += page.get("items") or []
            if not (token := page.get("nextPageToken")):
                return items

    def _workers(self, attempt: Attempt) -> int:
        return 1

    def _create(self, attempt: Attempt, zone: str, workers: int) -> str | None:
        mt = machine_type(attempt.options)
        scheduling: dict[str, Any] = {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
        kind, reservation = self.capacity(attempt)
        if kind == "spot":
            scheduling.update(provisioningModel="SPOT", instanceTerminationAction="DELETE")
        if self.max_run_seconds > 0:
            scheduling.update(instanceTerminationAction="DELETE",
                              maxRunDuration={"seconds": str(self.max_run_seconds)})  # fmt: skip
        nic: dict[str, Any] = {"accessConfigs": [{"type": "ONE_TO_ONE_NAT"}]}
        for key in ("network", "subnetwork"):
            if self.settings.get(key):
                nic[key] = self.settings[key]
        body: dict[str, Any] = {
            "name": attempt.name,
            "machineType": f"zones/{zone}/machineTypes/{mt}",
            "labels": labels_for(attempt, self.tag, self.kind),
            "scheduling": scheduling,
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "initializeParams": {
                        "sourceImage": self.settings.get("image") or IMAGE,
                        "diskSizeGb": str(int(self.settings.get("disk_gb", 200))),
                    },
                }
            ],
            "networkInterfaces": [nic],
            "metadata": {
                "items": [
                    {"key": "startup-script", "value": self.script(attempt, workers)},
                    {"key": "bastion-job-name", "value": attempt.job},
                    {"key": "install-nvidia-driver", "value": "True"},
                ]
            },
        }
        if gpu := attempt.options.get("accelerator"):  # N1 only
            body["guestAccelerators"] = [
                {
                    "acceleratorType": f"zones/{zone}/acceleratorTypes/{gpu}",
                    "acceleratorCount": int(attempt.options.get("accelerator_count", 1)),
                }
            ]
        if kind == "reserved":  # cloud.md 2.2: a named reservation, or any that fits
            body["reservationAffinity"] = (
                {"consumeReservationType": "SPECIFIC_RESERVATION",
                 "key": "compute.googleapis.com/reservation-name", "values": [reservation]}
                if reservation else {"consumeReservationType": "ANY_RESERVATION"}
            )  # fmt: skip
        if self.settings.get("service_account"):
            body["serviceAccounts"] = [
                {
                    "email": self.settings["service_account"],
                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                }
            ]
        request = self.instances().insert(
            project=self.project,
            zone=zone,
            body=body,
            requestId=request_id(self.root, attempt.name),
        )
        return self.execute(request, retries=0).get("name")

    def _quota_reason(self, error: HttpError) -> str | None:
        details = error.error_details if isinstance(error.error_details, list) else []
        if error.status_code == 403 and any(
            isinstance(d, dict) and d.get("reason") == "quotaExceeded" for d in details
        ):
            m = re.search(r"Quota '([^']+)'", str(details[0].get("message", "")))
            return m.group(1) if m else "quota"
        return None

    def job_of(self, resource: dict) -> str | None:
        items = (resource.get("metadata") or {}).get("items") or []
        return next((i.get("value") for i in items if i.get("key") == "bastion-job-name"), None)

    def _instance_link(self, handle: Handle) -> str:
        return (f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/"
                f"{handle['zone']}/instances/{handle['name']}")  # fmt: skip

    # -- poll --------------------------------------------------------------------------------
    def poll(self, handle: Handle) -> Observation:
        inst = self.listing(handle["zone"]).get(handle["name"])
        status = inst.get("status", "") if inst else "ABSENT"
        if status == "RUNNING":
            return self.up(handle)
        if status in _PROVISIONING:
            return Observation(Phase.PROVISIONING, f"instance {status} in {handle['zone']}")
        if status == "REPAIRING":
            return self.transient(handle, status)
        # absent: a failed insert first (a spot VM preempted while being created has a
        # preempted operation too, but it never ran: its zone backs off)
        if inst is None and (failed := self._insert_failed(handle)) is not None:
            return failed
        if self._was_preempted(handle):
            return self.preempted(handle, f"instance {handle['name']} preempted in "
                                  f"{handle['zone']}")  # fmt: skip
        if (switched := self._switched_off(handle, status)) is not None:
            return switched
        return self.gone(handle, f"instance {handle['name']} {status.lower()}")

    def _switched_off(self, handle: Handle, status: str) -> Observation | None:
        """The dead man's switch ended the VM: gone or stopped, not preempted, not by us, at
        least ``max_run_seconds`` after its insert was issued (the VM's own run began later,
        so a VM younger than that by this count cannot have reached its limit)."""
        if self.max_run_seconds <= 0 or status not in ("ABSENT", "STOPPING", "TERMINATED"):
            return None
        with self._lock:
            if handle["name"] in self._stopped:
                return None
        created = self.created(handle)
        if created is None or time.time() - created < self.max_run_seconds:
            return None
        why = (f"VM {handle['name']} in {handle['zone']} reached max_run_seconds "
               f"({self.max_run_seconds} s), its dead man's switch (scheduling.maxRunDuration): "
               "raise the gce runner's max_run_seconds setting for longer jobs")  # fmt: skip
        return self.ended(handle, Observation(Phase.FAILED, why))

    def _was_preempted(self, handle: Handle) -> bool:
        """A ``compute.instances.preempted`` op for this instance (asked only once the
        instance is stopping or gone, so it costs nothing in the steady state)."""
        request = self.zone_operations().list(
            project=self.project, zone=handle["zone"],
            filter=(f'operationType="compute.instances.preempted" AND '
                    f'targetLink="{self._instance_link(handle)}"'))  # fmt: skip
        return bool(self.execute(request).get("items"))

    def _insert_failed(self, handle: Handle) -> Observation | None:
        op_name = handle.get("op") or (
            self.store.read_provision(handle["job"], handle["name"]) or {}
        ).get("op")
        if not op_name:
            return None
        try:
            op = self.execute(
                self.zone_operations().get(
                    project=self.project, zone=handle["zone"], operation=op_name
                )
            )
        except HttpError as e:
            if e.status_code == 404:
                return None
            raise
        if op.get("status") != "DONE":
            return Observation(Phase.PROVISIONING, f"inserting in {handle['zone']}")
        errors = (op.get("error") or {}).get("errors") or []
        if not errors:
            return None
        code, message = errors[0].get("code", ""), errors[0].get("message", "")
        if code in _STOCKOUT:
            return self.stockout(handle, message)
        if code == "QUOTA_EXCEEDED":
            region = region_of(handle["zone"])
            why = f"quota exceeded in region {region}: {message}"
            self.blocks.block(f"region:{region}", why, self.zone_block_seconds)
            return Observation(Phase.FAILED, why, retryable=True)
        if code == "UNSUPPORTED_OPERATION":  # observed when a spot VM is preempted while created
            return self.create_failed(handle, f"preempted while creating in {handle['zone']}: "
                                      f"{message}", Phase.PREEMPTED)  # fmt: skip
        return self.create_failed(
            handle, f"insert failed in {handle['zone']}: error code {code}: {message}"
        )

    def startup_output(self, handle: Handle, worker: int) -> str | None:
        """The ``startup-script`` lines of the VM's serial port output (``instances.
        getSerialPortOutput``, port 1: the guest agent's ``google_metadata_script_runner``
        prefixes each line the script prints with ``startup-script:``), Compute's own record
        of the boot, there even when the script could copy nothing to the bucket; else what
        the script copied there."""
        try:
            out = self.execute(self.instances().getSerialPortOutput(
                project=self.project, zone=handle["zone"], instance=handle["name"], port=1))
        except HttpError:
            out = {}  # fmt: skip
        marker = "startup-script: "
        lines = [line.split(marker, 1)[1] for line in str(out.get("contents") or "").splitlines()
                 if marker in line]  # fmt: skip
        if lines:
            return last_lines("\n".join(lines))
        return super().startup_output(handle, worker)

    # -- stop, delete, list ------------------------------------------------------------------
    def _going(self, resource: dict) -> bool:
        return resource.get("status") == "STOPPING"  # a VM being deleted stops first

    def _request_delete(self, handle: Handle) -> None:
        try:
            self.execute(
                self.instances().delete(
                    project=self.project, zone=handle["zone"], instance=handle["name"]
                )
            )
        except HttpError as e:
            if e.status_code != 404:
                raise
        self.deleted(handle["zone"])

    def _list_resources(self) -> list[Owned]:
        return [
            self.owned(inst, zone, 1, inst.get("status") in _GONE)
            for zone in self.zones
            for inst in self.listing(zone).values()
        ]
