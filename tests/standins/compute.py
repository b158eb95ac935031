"""Compute Engine v1 stand-in for GPU VMs (Google's API documentation) for the real googleapiclient.

    server = ComputeServer().start()
    gce = discovery.build("compute", "v1", static_discovery=True,
                          credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": server.endpoint})  # …/compute/v1/

Virtual time (see common.py): an inserted instance is PROVISIONING with its op PENDING; each tick
moves it one step: STAGING (op RUNNING) -> RUNNING (op DONE, ``on_ready(instance, 0, metadata)``).
A deleted instance is STOPPING until the next tick, then gone (op DONE). ``preempt`` acts at once.

A RUNNING instance whose ``scheduling.maxRunDuration`` has passed (virtual time since its
``lastStartTimestamp``) is ended by the service as its ``instanceTerminationAction`` says:
gone (DELETE) or TERMINATED (STOP, the default), with no ``compute.instances.preempted``
operation.

``instances.getSerialPortOutput`` serves ``console(name)`` (the guest's startup output, given
by the test) as the guest environment's ``startup-script:`` lines.

Injections: ``stockout(zone)``/``restock(zone)``, ``quota(zone)``/``lift_quota(zone)``,
``fail_creates(code, message, zone, times)`` (the insert operation ends DONE with
``error.errors[{code, message}]`` at the next tick and no VM is left, e.g. code
``INTERNAL_ERROR``), ``preempt(name)``, and (common) ``rate_limit(n)``, ``transient_5xx(n)``.
"""

from __future__ import annotations

import re
import uuid

from .common import (
    ApiError,
    CapacityInjections,
    StandinServer,
    camel_keys,
    gce_error,
    paginate,
    parse_filter,
    public,
    virtual_seconds,
)

LINK = "https://www.googleapis.com/compute/v1/"  # selfLink/targetLink base, as the real API
_ZONE = r"/compute/v1/projects/([^/]+)/zones/([^/]+)"
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
MACHINE_TYPES = re.compile(
    r"(?P<gpu>a2-(high|ultra)gpu-(1|2|4|8)g|a2-megagpu-16g|a3-(high|mega|ultra)gpu-8g"
    r"|a3-highgpu-(1|2|4)g|g2-standard-(4|8|12|16|24|32|48|96))"
    r"|n1-(standard|highmem|highcpu)-(1|2|4|8|16|32|64|96)|e2-(standard|highmem)-(2|4|8|16|32)"
    r"|e2-(micro|small|medium)|n2-standard-(2|4|8|16|32|48|64|80|96|128)"
)
QUOTA_METRIC = {"a2": "NVIDIA_A100_GPUS", "a3": "NVIDIA_H100_GPUS", "g2": "NVIDIA_L4_GPUS"}


class ComputeServer(CapacityInjections, StandinServer):
    # stockout(zone): inserts there end with op error ZONE_RESOURCE_POOL_EXHAUSTED, no VM.
    # quota(zone): Inserts (in ``zone``, or anywhere) answer a synchronous 403 quotaExceeded.
    routes = [
        ("POST", _ZONE + r"/instances", "_insert"),
        ("GET", _ZONE + r"/instances", "_list"),
        ("GET", r"/compute/v1/projects/([^/]+)/aggregated/instances", "_aggregated"),
        ("GET", _ZONE + r"/instances/([^/]+)", "_get"),
        ("GET", _ZONE + r"/instances/([^/]+)/serialPort", "_serial_port"),
        ("DELETE", _ZONE + r"/instances/([^/]+)", "_delete"),
        ("GET", _ZONE + r"/operations", "_list_ops"),
        ("GET", _ZONE + r"/operations/([^/]+)", "_get_op"),
        ("POST", _ZONE + r"/operations/([^/]+)/wait", "_get_op"),
    ]

    def __init__(self, console=None, **kw):
        super().__init__(**kw)
        # console(instance name) -> bytes: what the VM's startup script printed so far (the
        # test's guests keep it); served as the serial port's ``startup-script:`` lines
        self.console = console
        self.instances: dict[tuple[str, str, str], dict] = {}  # (project, zone, name) -> Instance
        self.ops: dict[tuple[str, str, str], dict] = {}  # (project, zone, op name) -> Operation
        self._requests: dict[str, tuple[str, str, str]] = {}  # requestId -> op key
        self._stocked_out: set[str] = set()
        self._quota: set[str | None] = set()
        self._failing: list[list] = []  # fail_creates: [zone, code, message, times left]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/compute/v1/"

    # --- injections -------------------------------------------------------------------------
    def preempt(self, name: str):
        """Spot/preemptible VM: TERMINATED (instanceTerminationAction STOP, the default) or gone
        (DELETE), plus a DONE ``compute.instances.preempted`` op by ``system``. A still pending
        insert op fails with UNSUPPORTED_OPERATION (preempted during creation)."""
        with self.lock:
            key = next((k for k in self.instances if k[2] == name), None)
            if key is None:
                raise KeyError(name)
            inst = self.instances[key]
            sched = inst.get("scheduling") or {}
            if sched.get("provisioningModel") != "SPOT" and not sched.get("preemptible"):
                raise ValueError(f"{name} is neither spot nor preemptible")
            if inst["_op"] and self.ops[inst["_op"]]["status"] != "DONE":
                self._finish(
                    inst["_op"],
                    error=(
                        "UNSUPPORTED_OPERATION",
                        (f"The resource '{self._path(key)}' was preempted during creation."),
                    ),
                )
            op = self._op(key, "compute.instances.preempted", user="system")
            self._finish(op, status_message="Instance was preempted.")
            if sched.get("instanceTerminationAction") == "DELETE":
                del self.instances[key]
            else:
                inst.update(
                    status="TERMINATED",
                    lastStopTimestamp=self.now(),
                    statusMessage="Instance was preempted.",
                )

    # --- helpers ----------------------------------------------------------------------------
    def _rate_limit_error(self) -> ApiError:
        return gce_error(429, "rateLimitExceeded", "Rate Limit Exceeded", domain="usageLimits")

    def _unavailable_error(self) -> ApiError:
        return gce_error(503, "backendError", "Backend Error")

    def _no_route(self, method, path) -> ApiError:
        return gce_error(404, "notFound", f"The requested URL {path} was not found.")

    @staticmethod
    def _path(key, kind="instances") -> str:
        return f"projects/{key[0]}/zones/{key[1]}/{kind}/{key[2]}"

    def _not_found(self, key, kind="instances") -> ApiError:
        return gce_error(404, "notFound", f"The resource '{self._path(key, kind)}' was not found")

    def _op(self, key, op_type: str, user: str = "anonymous", request_id: str | None = None):
        project, zone, _ = key
        n = self._next()
        name = f"operation-{1767225600000 + n}-{uuid.UUID(int=n).hex[:13]}-stand-in"
        op_key = (project, zone, name)
        inst = self.instances.get(key) or {}
        self.ops[op_key] = {
            "kind": "compute#operation",
            "id": str(7000 + n),
            "name": name,
            "operationType": op_type,
            "status": "PENDING",
            "progress": 0,
            "zone": f"{LINK}projects/{project}/zones/{zone}",
            "targetLink": LINK + self._path(key),
            "targetId": inst.get("id", ""),
            "user": user,
            "insertTime": self.now(),
            "startTime": self.now(),
            "selfLink": LINK + self._path(op_key, "operations"),
            **({"clientOperationId": request_id} if request_id else {}),
        }
        return op_key

    def _finish(self, op_key, error: tuple[str, str] | None = None, status_message=None):
        op = self.ops[op_key]
        op.update(status="DONE", progress=100, endTime=self.now())
        if status_message:
            op["statusMessage"] = status_message
        if error:
            op["error"] = {"errors": [{"code": error[0], "message": error[1]}]}
            op.update(httpErrorStatusCode=400, httpErrorMessage="BAD REQUEST")

    def _dedupe(self, query) -> dict | None:
        request_id = query.get("requestId")
        if request_id is None:
            return None
        try:
            ok = uuid.UUID(request_id).int != 0
        except ValueError:
            ok = False
        if not ok:
            raise gce_error(
                400,
                "invalid",
                f"Invalid value for field 'requestId': "
                f"'{request_id}'. The request id must be a valid UUID.",
            )
        op_key = self._requests.get(request_id)
        return public(self.ops[op_key]) if op_key in self.ops else None

    def _validate(self, zone: str, body: dict) -> bool:
        """Returns whether the VM has GPUs. Raises 400 ``invalid`` like the real API."""

        def invalid(field, message):
            raise gce_error(
                400, "invalid", f"Invalid value for field 'resource.{field}': {message}"
            )

        name = body.get("name", "")
        if not NAME.fullmatch(name):
            invalid(
                "name",
                f"'{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'",
            )
        mt = body.get("machineType", "")
        m = re.fullmatch(r"(?:.*/)?zones/([^/]+)/machineTypes/([^/]+)", mt)
        if not m or m.group(1) != zone or not MACHINE_TYPES.fullmatch(m.group(2)):
            invalid(
                "machineType",
                f"'{mt}'. Machine type with name "
                f"'{mt.rsplit('/', 1)[-1]}' does not exist in zone '{zone}'.",
            )
        gpu = bool(MACHINE_TYPES.fullmatch(m.group(2))["gpu"] or body.get("guestAccelerators"))
        sched = body.get("scheduling") or {}
        spot = sched.get("provisioningModel") == "SPOT" or sched.get("preemptible")
        if spot and sched.get("automaticRestart", False):
            invalid(
                "scheduling.automaticRestart",
                "'true'. Spot and preemptible instances cannot be automatically restarted.",
            )
        if (spot or gpu) and sched.get("onHostMaintenance", "TERMINATE") != "TERMINATE":
            invalid(
                "scheduling.onHostMaintenance",
                f"'{sched['onHostMaintenance']}'. Instances with guest accelerators or "
                "Spot provisioning do not support live migration.",
            )
        if sched.get("instanceTerminationAction", "STOP") not in ("STOP", "DELETE"):
            invalid(
                "scheduling.instanceTerminationAction", f"'{sched['instanceTerminationAction']}'."
            )
        return gpu

    # --- instances --------------------------------------------------------------------------
    def _insert(self, project, zone, query, body):
        body = camel_keys(body)
        if (op := self._dedupe(query)) is not None:
            return 200, op
        self._validate(zone, body)
        key = (project, zone, body["name"])
        if key in self.instances:
            raise gce_error(
                409, "alreadyExists", f"The resource '{self._path(key)}' already exists"
            )
        if zone in self._quota or None in self._quota:
            family = body["machineType"].rsplit("/", 1)[-1].split("-")[0]
            metric = QUOTA_METRIC.get(family, "CPUS")
            raise gce_error(
                403,
                "quotaExceeded",
                f"Quota '{metric}' exceeded.  Limit: 0.0 in region {zone.rsplit('-', 1)[0]}.",
                domain="usageLimits",
            )
        n = self._next()
        inst = {
            **body,
            "kind": "compute#instance",
            "id": str(4_000_000 + n),
            "creationTimestamp": self.now(),
            "status": "PROVISIONING",
            "zone": f"{LINK}projects/{project}/zones/{zone}",
            "machineType": f"{LINK}projects/{project}/zones/{zone}/machineTypes/"
            + body["machineType"].rsplit("/", 1)[-1],
            "selfLink": LINK + self._path(key),
            "labels": body.get("labels") or {},
            "labelFingerprint": "42WmSpB8rSM=",
            "networkInterfaces": [
                {**nic, "networkIP": f"10.128.0.{n % 250 + 2}"}
                for nic in body.get("networkInterfaces") or [{}]
            ],
        }
        self.instances[key] = inst
        op_key = self._op(key, "insert", request_id=query.get("requestId"))
        inst["_op"] = op_key
        if query.get("requestId"):
            self._requests[query["requestId"]] = op_key
        return 200, public(self.ops[op_key])

    def _get(self, project, zone, name, query, body):
        key = (project, zone, name)
        if key not in self.instances:
            raise self._not_found(key)
        return 200, public(self.instances[key])

    def _serial_port(self, project, zone, name, query, body):
        """``instances.getSerialPortOutput`` (port 1): the console as the guest environment
        writes it, a boot line then each line of the startup script prefixed by
        ``google_metadata_script_runner[pid]: startup-script:``; from byte ``start`` of the
        last 1 MB (older bytes are overwritten: ``start`` then says where the output begins)."""
        key = (project, zone, name)
        if key not in self.instances:
            raise self._not_found(key)
        if str(query.get("port") or "1") != "1":
            return 200, {
                "kind": "compute#serialPortOutput",
                "contents": "",
                "start": "0",
                "next": "0",
            }
        printed = self.console(name) if self.console else b""
        stamp = self.instances[key].get("lastStartTimestamp") or self.now()
        text = f"{stamp} {name} kernel: Linux version 6.1.0-stand-in\n" + "".join(
            f"{stamp} {name} google_metadata_script_runner[1234]: startup-script: {line}\n"
            for line in printed.decode(errors="replace").splitlines()
        )
        data = text.encode()
        earliest = max(0, len(data) - (1 << 20))
        start = max(int(query.get("start") or 0), earliest)
        return 200, {
            "kind": "compute#serialPortOutput",
            "contents": data[start:].decode(errors="replace"),
            "start": str(start),
            "next": str(len(data)),
            "selfLink": f"{LINK}{self._path(key)}/serialPort?port=1",
        }

    def _matching(self, project, zone, query) -> list[dict]:
        pred = parse_filter(query.get("filter"))
        return [
            public(i)
            for k, i in sorted(self.instances.items())
            if k[0] == project and (zone is None or k[1] == zone) and pred(i)
        ]

    def _list(self, project, zone, query, body):
        items = self._matching(project, zone, query)
        page, token = paginate(items, int(query.get("maxResults") or 500), query.get("pageToken"))
        out = {
            "kind": "compute#instanceList",
            "items": page,
            "selfLink": f"{LINK}projects/{project}/zones/{zone}/instances",
        }
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _aggregated(self, project, query, body):
        items = self._matching(project, None, query)
        page, token = paginate(items, int(query.get("maxResults") or 500), query.get("pageToken"))
        grouped: dict[str, dict] = {}
        for inst in page:
            zone = "zones/" + inst["zone"].rsplit("/", 1)[1]
            grouped.setdefault(zone, {"instances": []})["instances"].append(inst)
        out = {"kind": "compute#instanceAggregatedList", "items": grouped}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _delete(self, project, zone, name, query, body):
        if (op := self._dedupe(query)) is not None:
            return 200, op
        key = (project, zone, name)
        inst = self.instances.get(key)
        if inst is None:
            raise self._not_found(key)
        inst["status"] = "STOPPING"
        op_key = self._op(key, "delete", request_id=query.get("requestId"))
        inst["_del_op"] = op_key
        if query.get("requestId"):
            self._requests[query["requestId"]] = op_key
        return 200, public(self.ops[op_key])

    # --- operations -------------------------------------------------------------------------
    def _get_op(self, project, zone, name, query, body):
        key = (project, zone, name)
        if key not in self.ops:
            raise self._not_found(key, "operations")
        return 200, public(self.ops[key])

    def _list_ops(self, project, zone, query, body):
        pred = parse_filter(query.get("filter"))
        items = [
            public(o) for k, o in sorted(self.ops.items()) if k[:2] == (project, zone) and pred(o)
        ]
        page, token = paginate(items, int(query.get("maxResults") or 500), query.get("pageToken"))
        out = {"kind": "compute#operationList", "items": page}
        if token:
            out["nextPageToken"] = token
        return 200, out

    # --- virtual time -----------------------------------------------------------------------
    def _past_max_run(self, inst: dict) -> bool:
        limit = ((inst.get("scheduling") or {}).get("maxRunDuration") or {}).get("seconds")
        started = inst.get("lastStartTimestamp")
        return bool(limit and started) and self.clock - virtual_seconds(started) >= int(limit)

    def _step(self):
        for key, inst in list(self.instances.items()):
            status = inst["status"]
            if status == "PROVISIONING":
                if key[1] in self._stocked_out:
                    del self.instances[key]
                    self._finish(
                        inst["_op"],
                        error=(
                            "ZONE_RESOURCE_POOL_EXHAUSTED",
                            (
                                f"The zone 'projects/{key[0]}/zones/{key[1]}' does not have enough "
                                "resources available to fulfill the request.  Try a different zone, or "  # noqa: E501
                                "try again later."
                            ),
                        ),
                    )
                    continue
                if (failure := self._create_failure(key[1])) is not None:
                    del self.instances[key]
                    self._finish(inst["_op"], error=failure)
                    continue
                inst["status"] = "STAGING"
                self.ops[inst["_op"]].update(status="RUNNING", progress=50)
            elif status == "STAGING":
                inst.update(status="RUNNING", lastStartTimestamp=self.now())
                self._finish(inst["_op"])
                md = {
                    i["key"]: i.get("value", "")
                    for i in (inst.get("metadata") or {}).get("items", [])
                }
                self._ready(inst, 0, {**md, "instance-id": inst["id"], "hostname": key[2]})
            elif status == "RUNNING" and self._past_max_run(inst):
                if (inst.get("scheduling") or {}).get("instanceTerminationAction") == "DELETE":
                    del self.instances[key]
                else:
                    inst.update(
                        status="TERMINATED",
                        lastStopTimestamp=self.now(),
                        statusMessage="Instance reached its maxRunDuration.",
                    )
            elif status == "STOPPING" and inst.get("_del_op"):
                del self.instances[key]
                if self.ops[inst["_op"]]["status"] != "DONE":  # deleted while being created
                    self._finish(
                        inst["_op"],
                        error=(
                            "RESOURCE_NOT_FOUND",
                            (f"The resource '{self._path(key)}' was deleted during creation."),
                        ),
                    )
                self._finish(inst["_del_op"])
