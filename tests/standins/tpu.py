"""Cloud TPU API v2 stand-in (Google's API documentation) for the real googleapiclient.

    server = TpuServer().start()
    tpu = discovery.build("tpu", "v2", static_discovery=True, credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": server.endpoint})

Virtual time (see common.py): per tick, a CREATING node counts down ``provision_ticks`` then turns
READY (one ``networkEndpoints`` entry per host; ``on_ready(node, worker, metadata)`` once per
worker; create op done with the Node); a DELETING node counts down ``delete_ticks`` then is gone.
A queued resource moves one state per tick: CREATING -> ACCEPTED -> WAITING_FOR_RESOURCES (stays
while its zone is stocked out; FAILED once ``validUntil*`` has passed) -> PROVISIONING (its nodes
appear CREATING) -> ACTIVE (nodes READY); SUSPENDING -> SUSPENDED; DELETING -> gone.

The queued-resource create enforces the API's ``nodeSpec`` rule (:meth:`TpuServer.
_validate_spec`; several specs answer 400 unless ``accept_spec_per_slice``): a multislice is one
spec with ``multisliceParams``, its nodes ``<prefix>-0 ...`` carry ``multisliceNode`` and their
workers' ``tpu-env`` attribute the runtime's ``MEGASCALE_*`` lines.

Injections: ``stockout(zone)``/``restock(zone)``, ``quota(zone)``/``lift_quota(zone)``,
``fail_creates(code, message, zone, times)`` (a node's create operation ends with that
``google.rpc.Status`` at the next tick, e.g. code 13 INTERNAL or 3 INVALID_ARGUMENT; a queued
resource turns FAILED with it in ``failedData.error`` once it would get capacity),
``preempt(name)``, ``maintenance(name)`` (READY -> REPAIRING with ``health``
UNHEALTHY_MAINTENANCE for ``repair_ticks``, then READY again, every worker's startup script
run again: ``on_ready`` once more per worker, as after the hosts' reboot), ``phantom_409()``,
``stuck(qr)``, and (common) ``rate_limit(n)``, ``transient_5xx(n)``.
"""

from __future__ import annotations

import re

from .common import (
    ApiError,
    CapacityInjections,
    StandinServer,
    camel_keys,
    paginate,
    public,
    rpc_error,
    virtual_seconds,
)

_LOC = r"/v2/(projects/[^/]+/locations/[^/]+)"
NODE_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
QR_ID = re.compile(r"[A-Za-z0-9_.~+%-]+")
NODE_T = "type.googleapis.com/google.cloud.tpu.v2.Node"
QR_T = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_T = "type.googleapis.com/google.protobuf.Empty"
META_T = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
_CONFIG_FAMILY = {
    "V2": ("v2", 2),
    "V3": ("v3", 2),
    "V4": ("v4", 2),
    "V5P": ("v5p", 2),
    "V5LITE_POD": ("v5litepod", 1),
    "V6E": ("v6e", 1),
}  # type -> (prefix, cores/chip)


def accelerator_type(node: dict) -> str:
    """``acceleratorType``, or the one that ``acceleratorConfig{type, topology}`` describes."""
    if node.get("acceleratorType"):
        return node["acceleratorType"]
    cfg = node["acceleratorConfig"]
    prefix, per_chip = _CONFIG_FAMILY[cfg["type"]]
    chips = 1
    for d in cfg["topology"].split("x"):
        chips *= int(d)
    return f"{prefix}-{chips * per_chip}"


def hosts(acc_type: str) -> int:
    """Worker VMs per slice (Cloud TPU's documentation): v2/v3/v4/v5p count TensorCores, 8 per host;
    v5litepod/v6e count chips, a single host up to 8 chips, 4 per host beyond."""
    m = re.fullmatch(r"(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)", acc_type)
    if not m:
        raise ValueError(acc_type)
    family, n = m.group(1), int(m.group(2))
    if family in ("v5litepod", "v6e"):
        return 1 if n <= 8 else n // 4
    return max(1, n // 8)


def _duration(text: str) -> float:
    return float(text.rstrip("s"))


class TpuServer(CapacityInjections, StandinServer):
    # stockout(zone): Creates in ``zone`` end with op error code 8; queued resources wait.
    # quota(zone): Creates (in ``zone``, or anywhere) answer 429 RESOURCE_EXHAUSTED + QuotaFailure.
    routes = [
        ("POST", _LOC + r"/nodes", "_create_node"),
        ("GET", _LOC + r"/nodes", "_list_nodes"),
        ("GET", r"/v2/(projects/[^/]+/locations/[^/]+/nodes/[^/:]+)", "_get_node"),
        ("DELETE", r"/v2/(projects/[^/]+/locations/[^/]+/nodes/[^/:]+)", "_delete_node"),
        ("GET", r"/v2/(projects/[^/]+/locations/[^/]+/operations/[^/:]+)", "_get_op"),
        ("POST", _LOC + r"/queuedResources", "_create_qr"),
        ("GET", _LOC + r"/queuedResources", "_list_qrs"),
        ("GET", r"/v2/(projects/[^/]+/locations/[^/]+/queuedResources/[^/:]+)", "_get_qr"),
        ("DELETE", r"/v2/(projects/[^/]+/locations/[^/]+/queuedResources/[^/:]+)", "_delete_qr"),
    ]

    def __init__(
        self, provision_ticks: int = 2, delete_ticks: int = 1, repair_ticks: int = 1, **kw
    ):
        super().__init__(**kw)
        self.provision_ticks, self.delete_ticks = provision_ticks, delete_ticks
        self.repair_ticks = repair_ticks
        self.nodes: dict[str, dict] = {}
        self.qrs: dict[str, dict] = {}
        self.ops: dict[str, dict] = {}
        self._qr_requests: dict[str, str] = {}  # requestId -> operation name
        self._stocked_out: set[str] = set()
        self._quota: set[str | None] = set()
        self._failing: list[list] = []  # fail_creates: [zone, code, message, times left]
        self._phantom = 0
        # Queued resources an older daemon made with one nodeSpec per slice: tests of their
        # adoption and deletion set this to make one (the rule is enforced otherwise).
        self.accept_spec_per_slice = False

    # --- injections -------------------------------------------------------------------------
    def phantom_409(self, n: int = 1):
        """The next ``n`` creates succeed (the object exists afterwards) but answer 409."""
        with self.lock:
            self._phantom += n

    def preempt(self, name: str):
        """Spot/preemptible node -> PREEMPTED (kept until deleted; a pending create op fails with
        code 3). Queued resource -> its nodes PREEMPTED, QR SUSPENDING (SUSPENDED next tick)."""
        with self.lock:
            if (qr := self._find(self.qrs, name)) is not None:
                qr["state"] = {"state": "SUSPENDING", "stateInitiator": "SERVICE"}
                for n in self._qr_nodes(qr):
                    n["state"] = "PREEMPTED"
                return
            node = self._find(self.nodes, name)
            if node is None:
                raise KeyError(name)
            if not node["_spot"]:
                raise ValueError(f"{name} is neither spot nor preemptible")
            if node["state"] == "CREATING" and node["_op"]:
                self._finish(
                    node["_op"],
                    error={
                        "code": 3,
                        "message": (
                            "Cloud TPU received a bad request. update is not supported while in state "  # noqa: E501
                            "PREEMPTED"
                        ),
                    },
                )
            node["state"] = "PREEMPTED"

    def maintenance(self, name: str):
        """A maintenance event on a READY node: REPAIRING, ``health`` UNHEALTHY_MAINTENANCE,
        for ``repair_ticks``; then READY and HEALTHY again, and every worker's startup script
        runs again (``on_ready`` per worker), as after the reboot that maintenance is."""
        with self.lock:
            node = self._find(self.nodes, name)
            if node is None:
                raise KeyError(name)
            if node["state"] != "READY":
                raise ValueError(f"{name} is {node['state']}, not READY")
            node.update(state="REPAIRING", health="UNHEALTHY_MAINTENANCE", _left=self.repair_ticks)

    def stuck(self, name: str, frozen: bool = True):
        """Freeze a queued resource in its current state (no advance, no expiry)."""
        with self.lock:
            qr = self._find(self.qrs, name)
            if qr is None:
                raise KeyError(name)
            qr["_stuck"] = frozen

    @staticmethod
    def _find(table: dict, name: str):
        if name in table:
            return table[name]
        hits = [v for k, v in table.items() if k.endswith("/" + name)]
        return hits[0] if len(hits) == 1 else None

    # --- helpers ----------------------------------------------------------------------------
    def _rate_limit_error(self) -> ApiError:
        return rpc_error(
            429,
            "RESOURCE_EXHAUSTED",
            "Quota exceeded for quota metric 'Requests' "
            "and limit 'Requests per minute' of service 'tpu.googleapis.com'.",
        )

    def _unavailable_error(self) -> ApiError:
        return rpc_error(503, "UNAVAILABLE", "The service is currently unavailable.")

    def _not_found(self, name: str) -> ApiError:
        return rpc_error(404, "NOT_FOUND", f"Resource '{name}' was not found")

    def _op(self, parent: str, verb: str, target: str) -> dict:
        name = f"{parent}/operations/operation-{1767225600000 + self._next()}-stand-in"
        op = {
            "name": name,
            "done": False,
            "metadata": {
                "@type": META_T,
                "createTime": self.now(),
                "target": target,
                "verb": verb,
                "apiVersion": "v2",
            },
        }
        self.ops[name] = op
        return op

    def _finish(self, op_name: str, response: dict | None = None, error: dict | None = None):
        op = self.ops[op_name]
        if op["done"]:
            return
        op["done"] = True
        op["metadata"]["endTime"] = self.now()
        if error:
            op["error"] = error
        else:
            op["response"] = response or {"@type": EMPTY_T}

    def _guard_create(self, parent: str):
        zone = parent.rsplit("/", 1)[1]
        if zone in self._quota or None in self._quota:
            region = zone.rsplit("-", 1)[0]
            message = (
                f"Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. "
                f"Limit 32 in region {region}"
            )
            raise rpc_error(
                429,
                "RESOURCE_EXHAUSTED",
                message,
                [
                    {
                        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                        "violations": [
                            {"subject": f"project:{parent.split('/')[1]}", "description": message}
                        ],
                    }
                ],
            )

    def _phantom_answer(self, name: str, op: dict):
        if self._phantom:
            self._phantom -= 1
            raise rpc_error(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        return 200, public(op)

    def _validate_node(self, node: dict, node_id: str):
        if not NODE_ID.fullmatch(node_id or ""):
            raise rpc_error(400, "INVALID_ARGUMENT", f"Invalid node id '{node_id}'.")
        if not node.get("runtimeVersion"):
            raise rpc_error(400, "INVALID_ARGUMENT", "Field runtimeVersion is required.")
        if bool(node.get("acceleratorType")) == bool(node.get("acceleratorConfig")):
            raise rpc_error(
                400,
                "INVALID_ARGUMENT",
                "Exactly one of acceleratorType or acceleratorConfig is required.",
            )
        try:
            return hosts(accelerator_type(node))
        except (KeyError, ValueError):
            raise rpc_error(400, "INVALID_ARGUMENT", "Unknown accelerator type.") from None

    @staticmethod
    def _validate_spec(spec: dict):
        """The API's rule for a ``nodeSpec`` (tpu.v2.json ``NodeSpec``): exactly
        one of ``nodeId`` ("only specified when requesting a single node") and
        ``multisliceParams``, whose ``nodeCount`` is more than 1 and ``nodeIdPrefix`` given."""
        multi = spec.get("multisliceParams")
        if ("nodeId" in spec) == (multi is not None):
            raise rpc_error(
                400,
                "INVALID_ARGUMENT",
                (
                    "Invalid node spec: exactly one of node_id and multislice_params must be set. "
                    "node_id is only specified when requesting a single node. In case of "
                    "multislice requests, multislice_params must be populated instead."
                ),
            )
        if multi is not None:
            count = multi.get("nodeCount")  # proto3 JSON: a number or a numeral
            if not str(count).isdigit() or int(count) <= 1:
                raise rpc_error(
                    400,
                    "INVALID_ARGUMENT",
                    (
                        f"Invalid multislice_params.node_count {count!r}: a multislice request "
                        "needs node_count greater than 1."
                    ),
                )
            if not multi.get("nodeIdPrefix"):
                raise rpc_error(
                    400, "INVALID_ARGUMENT", "multislice_params.node_id_prefix is required."
                )

    def _new_node(
        self, parent, node_id, body, op_name=None, qr_name=None, spot=False, multislice=None
    ) -> dict:
        name = f"{parent}/nodes/{node_id}"
        acc = accelerator_type(body)
        sched = body.get("schedulingConfig") or {}
        node = {
            **body,
            "name": name,
            "id": str(1000 + self._next()),
            "acceleratorType": acc,
            "state": "CREATING",
            "createTime": self.now(),
            "networkEndpoints": [],
            "apiVersion": "V2",
            "_hosts": hosts(acc),
            "_op": op_name,
            "_left": self.provision_ticks,
            "_qr": qr_name,
            "_spot": spot or bool(sched.get("spot") or sched.get("preemptible")),
        }
        if qr_name:
            node["queuedResource"] = qr_name
        if multislice is not None:  # (slice index, slice count, slice 0's node name)
            node.update(multisliceNode=True, _slice=multislice)
        self.nodes[name] = node
        return node

    @staticmethod
    def _ip(node: dict, host: int) -> str:
        return f"10.{int(node['id']) % 250}.0.{host + 2}"

    def _tpu_env(self, node: dict, worker: int) -> str:
        """The ``tpu-env`` attribute a TPU VM carries: lines ``KEY: 'value'``; a node of a
        multislice queued resource also gets the runtime's MEGASCALE_* (its slice, the slice
        count, slice 0's worker 0 as the coordinator, the port)."""
        env = {
            "ACCELERATOR_TYPE": node["acceleratorType"],
            "WORKER_ID": str(worker),
            "NODE_ID": node["name"].rsplit("/", 1)[1],
            "ZONE": node["name"].split("/")[3],
        }
        if node.get("_slice") is not None:
            i, n, first = node["_slice"]
            coordinator = self.nodes.get(first, node if i == 0 else None)
            env.update(
                MEGASCALE_SLICE_ID=str(i), MEGASCALE_NUM_SLICES=str(n), MEGASCALE_PORT="8080"
            )
            if coordinator is not None:
                env["MEGASCALE_COORDINATOR_ADDRESS"] = self._ip(coordinator, 0)
        return "".join(f"{k}: '{v}'\n" for k, v in env.items())

    def _make_ready(self, node: dict):
        node.update(state="READY", health="HEALTHY")
        k = int(node["id"]) % 250
        node["networkEndpoints"] = [
            {
                "ipAddress": self._ip(node, i),
                "port": 8470,
                "accessConfig": {"externalIp": f"203.0.{k}.{i + 2}"},
            }
            for i in range(node["_hosts"])
        ]
        if node["_op"]:
            self._finish(node["_op"], response={"@type": NODE_T, **public(node)})
        for i in range(node["_hosts"]):
            md = {
                **node.get("metadata", {}),
                "agent-worker-number": str(i),
                "accelerator-type": node["acceleratorType"],
                "instance-id": f"{node['id']}-w{i}",
                "tpu-env": self._tpu_env(node, i),
            }
            self._ready(node, i, md)

    def _qr_nodes(self, qr: dict) -> list[dict]:
        return [self.nodes[n] for n in qr["_nodes"] if n in self.nodes]

    # --- nodes ------------------------------------------------------------------------------
    def _create_node(self, parent, query, body):
        body = camel_keys(body)
        node_id = query.get("nodeId", "")
        self._validate_node(body, node_id)
        name = f"{parent}/nodes/{node_id}"
        if name in self.nodes:
            raise rpc_error(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        self._guard_create(parent)
        op = self._op(parent, "create", name)
        self._new_node(parent, node_id, body, op_name=op["name"])
        return self._phantom_answer(name, op)

    def _get_node(self, name, query, body):
        if name not in self.nodes:
            raise self._not_found(name)
        return 200, public(self.nodes[name])

    def _list_nodes(self, parent, query, body):
        items = [public(n) for k, n in sorted(self.nodes.items()) if k.startswith(parent + "/")]
        page, token = paginate(items, int(query.get("pageSize") or 0), query.get("pageToken"))
        out = {"nodes": page}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _delete_node(self, name, query, body):
        node = self.nodes.get(name)
        if node is None:
            raise self._not_found(name)
        op = self._op(name.split("/nodes/")[0], "delete", name)
        if node["state"] != "DELETING":
            node.update(state="DELETING", _left=self.delete_ticks)
        node["_del_op"] = op["name"]
        return 200, public(op)

    def _get_op(self, name, query, body):
        if name not in self.ops:
            raise self._not_found(name)
        return 200, public(self.ops[name])

    # --- queued resources -------------------------------------------------------------------
    def _create_qr(self, parent, query, body):
        body = camel_keys(body)
        qr_id, request_id = query.get("queuedResourceId", ""), query.get("requestId")
        if request_id and request_id in self._qr_requests:
            return 200, public(self.ops[self._qr_requests[request_id]])
        if not QR_ID.fullmatch(qr_id):
            raise rpc_error(400, "INVALID_ARGUMENT", f"Invalid queued resource id '{qr_id}'.")
        specs = (body.get("tpu") or {}).get("nodeSpec") or []
        if not specs:
            raise rpc_error(400, "INVALID_ARGUMENT", "tpu.nodeSpec is required.")
        if len(specs) > 1 and not self.accept_spec_per_slice:
            raise rpc_error(
                400,
                "INVALID_ARGUMENT",
                (
                    f"Invalid tpu.node_spec: {len(specs)} node specs were given. node_id is only "
                    "specified when requesting a single node. In case of multislice requests, "
                    "multislice_params must be populated instead (one node spec with node_count "
                    "and node_id_prefix)."
                ),
            )
        planned = []  # (parent, node id, node body, (slice, slices, slice 0's name) or None)
        for spec in specs:
            multi = spec.get("multisliceParams")
            self._validate_spec(spec)
            spec_parent = spec.get("parent", parent)
            if multi is not None:
                n, prefix = int(multi["nodeCount"]), multi["nodeIdPrefix"]
                first = f"{spec_parent}/nodes/{prefix}-0"
                ids = [(f"{prefix}-{i}", (i, n, first)) for i in range(n)]
            else:
                ids = [(spec["nodeId"], None)]
            for node_id, part in ids:
                self._validate_node(spec.get("node") or {}, node_id)
                planned.append((spec_parent, node_id, spec["node"], part))
        name = f"{parent}/queuedResources/{qr_id}"
        taken = [f"{p}/nodes/{i}" for p, i, _, _ in planned if f"{p}/nodes/{i}" in self.nodes]
        if name in self.qrs or taken:
            raise rpc_error(409, "ALREADY_EXISTS", f"Resource '{name}' already exists")
        self._guard_create(parent)
        policy = body.get("queueingPolicy") or {}
        expires = None
        if policy.get("validUntilDuration"):
            expires = self.clock + _duration(policy["validUntilDuration"])
        elif policy.get("validUntilTime"):
            expires = virtual_seconds(policy["validUntilTime"])
        op = self._op(parent, "create", name)
        self.qrs[name] = {
            **body,
            "name": name,
            "createTime": self.now(),
            "state": {"state": "CREATING"},
            "_op": op["name"],
            "_plan": planned,
            "_nodes": [],
            "_expires": expires,
            "_stuck": False,
            "_left": 0,
        }
        if request_id:
            self._qr_requests[request_id] = op["name"]
        return self._phantom_answer(name, op)

    def _get_qr(self, name, query, body):
        if name not in self.qrs:
            raise self._not_found(name)
        return 200, public(self.qrs[name])

    def _list_qrs(self, parent, query, body):
        items = [public(q) for k, q in sorted(self.qrs.items()) if k.startswith(parent + "/")]
        page, token = paginate(items, int(query.get("pageSize") or 0), query.get("pageToken"))
        out = {"queuedResources": page}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _delete_qr(self, name, query, body):
        qr = self.qrs.get(name)
        if qr is None:
            raise self._not_found(name)
        force = query.get("force", "").lower() == "true"
        if self._qr_nodes(qr) and not force:
            raise rpc_error(
                400,
                "FAILED_PRECONDITION",
                (
                    f"Cannot delete queued resource '{name}' in state {qr['state']['state']} while it "  # noqa: E501
                    "has nodes; delete the nodes first or set force=true."
                ),
            )
        op = self._op(name.split("/queuedResources/")[0], "delete", name)
        qr.update(
            state={"state": "DELETING", "stateInitiator": "USER"},
            _left=self.delete_ticks,
            _del_op=op["name"],
            _stuck=False,
        )
        for n in self._qr_nodes(qr):
            n.update(state="DELETING", _left=self.delete_ticks)
        return 200, public(op)

    # --- virtual time -----------------------------------------------------------------------
    def _step(self):
        for name, node in list(self.nodes.items()):
            zone = name.split("/")[3]
            if node["state"] == "CREATING" and not node["_qr"]:
                if zone in self._stocked_out:
                    del self.nodes[name]
                    self._finish(
                        node["_op"],
                        error={
                            "code": 8,
                            "message": (
                                f'There is no more capacity in the zone "{zone}"; you can try in another '  # noqa: E501
                                "zone where Cloud TPU Nodes are offered (see "
                                "https://cloud.google.com/tpu/docs/regions) [EID: 0x1b5e2c2d]"
                            ),
                        },
                    )
                    continue
                if (failure := self._create_failure(zone)) is not None:
                    del self.nodes[name]
                    self._finish(node["_op"], error={"code": failure[0], "message": failure[1]})
                    continue
                node["_left"] -= 1
                if node["_left"] <= 0:
                    self._make_ready(node)
            elif node["state"] == "REPAIRING":
                node["_left"] -= 1
                if node["_left"] <= 0:
                    self._make_ready(node)  # the hosts rebooted: startup scripts run again
            elif node["state"] == "DELETING":
                node["_left"] -= 1
                if node["_left"] <= 0:
                    del self.nodes[name]
                    if node["_op"]:  # deleted before it was READY: the create op fails
                        self._finish(
                            node["_op"],
                            error={
                                "code": 10,
                                "message": (f"Node '{name}' was deleted before it became ready."),
                            },
                        )
                    if node.get("_del_op"):
                        self._finish(node["_del_op"])
        for name, qr in list(self.qrs.items()):
            if not qr["_stuck"]:
                self._step_qr(name, qr)

    def _step_qr(self, name: str, qr: dict):
        state = qr["state"]["state"]
        zone = name.split("/")[3]
        expired = qr["_expires"] is not None and self.clock >= qr["_expires"]
        advance = {
            "CREATING": "ACCEPTED",
            "ACCEPTED": "WAITING_FOR_RESOURCES",
            "PROVISIONING": "ACTIVE",
            "SUSPENDING": "SUSPENDED",
        }
        if state in ("ACCEPTED", "WAITING_FOR_RESOURCES") and expired:
            qr["state"] = {
                "state": "FAILED",
                "stateInitiator": "SERVICE",
                "failedData": {
                    "error": {
                        "code": 8,
                        "message": (
                            f'There is no more capacity in the zone "{zone}"; the queued resource '
                            "could not be provisioned before its validUntil time."
                        ),
                    }
                },
            }
        elif state == "WAITING_FOR_RESOURCES":
            if zone in self._stocked_out:
                return
            if (failure := self._create_failure(zone)) is not None:
                qr["state"] = {
                    "state": "FAILED",
                    "stateInitiator": "SERVICE",
                    "failedData": {"error": {"code": failure[0], "message": failure[1]}},
                }
            else:
                qr["state"] = {"state": "PROVISIONING"}
                spot = "spot" in qr
                for parent, node_id, body, part in qr["_plan"]:
                    node = self._new_node(
                        parent, node_id, camel_keys(body), qr_name=name, spot=spot, multislice=part
                    )
                    qr["_nodes"].append(node["name"])
        elif state in advance:
            qr["state"] = {**qr["state"], "state": advance[state]}
            if state == "CREATING":
                self._finish(qr["_op"], response={"@type": QR_T, **public(qr)})
            elif state == "PROVISIONING":
                for node in self._qr_nodes(qr):
                    self._make_ready(node)
            elif state == "SUSPENDING":
                for n in qr["_nodes"]:
                    self.nodes.pop(n, None)
        elif state == "DELETING":
            qr["_left"] -= 1
            if qr["_left"] <= 0:
                del self.qrs[name]
                for n in qr["_nodes"]:
                    self.nodes.pop(n, None)
                self._finish(qr["_del_op"])
