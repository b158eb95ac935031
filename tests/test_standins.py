"""The TPU v2 and Compute v1 stand-ins, driven only through the real googleapiclient."""

import uuid

import pytest
from google.auth.credentials import AnonymousCredentials
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from tests.standins.compute import ComputeServer
from tests.standins.tpu import TpuServer

P, Z = "proj", "us-central2-b"
PARENT = f"projects/{P}/locations/{Z}"
V4 = {
    "acceleratorType": "v4-32",
    "runtimeVersion": "tpu-ubuntu2204-base",
    "schedulingConfig": {"spot": True},
    "labels": {"bastion-job": "j1"},
    "metadata": {"startup-script": "#!/bin/bash\necho hi"},
}


def build(api, version, endpoint):
    return discovery.build(
        api,
        version,
        static_discovery=True,
        cache_discovery=False,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": endpoint},
    )


def http_error(request) -> HttpError:
    with pytest.raises(HttpError) as info:
        request.execute()
    return info.value


def retried(request, n=5):
    request._sleep = lambda _s: None
    return request.execute(num_retries=n)


# --- TPU v2 --------------------------------------------------------------------------------
@pytest.fixture
def tpu_server():
    calls = []
    server = TpuServer(on_ready=lambda node, i, md: calls.append((node["name"], i, md)))
    server.ready_calls = calls
    with server:
        yield server


@pytest.fixture
def tpu(tpu_server):
    api = build("tpu", "v2", tpu_server.endpoint).projects().locations()
    return api


def create_node(tpu, node_id, body=V4):
    return tpu.nodes().create(parent=PARENT, nodeId=node_id, body=body).execute()


def get(tpu, kind, name):
    return getattr(tpu, kind)().get(name=f"{PARENT}/{kind}/{name}").execute()


def test_tpu_create_ready_with_endpoints_and_on_ready_per_worker(tpu_server, tpu):
    op = create_node(tpu, "j1-a0")
    assert op["done"] is False and op["name"].startswith(f"{PARENT}/operations/operation-")
    assert op["metadata"]["verb"] == "create"
    assert get(tpu, "nodes", "j1-a0")["state"] == "CREATING"
    tpu_server.tick()
    assert tpu.operations().get(name=op["name"]).execute()["done"] is False
    tpu_server.tick()
    op = tpu.operations().get(name=op["name"]).execute()
    assert op["done"] and op["response"]["@type"].endswith("tpu.v2.Node")
    node = get(tpu, "nodes", "j1-a0")
    assert (node["state"], node["health"]) == ("READY", "HEALTHY")
    assert len(node["networkEndpoints"]) == 4 and node["labels"] == {"bastion-job": "j1"}
    calls = tpu_server.ready_calls
    assert [(n, i) for n, i, _ in calls] == [(f"{PARENT}/nodes/j1-a0", i) for i in range(4)]
    assert calls[2][2]["startup-script"].startswith("#!/bin/bash")
    assert calls[2][2]["agent-worker-number"] == "2"
    tpu_server.tick(3)
    assert len(calls) == 4  # once per worker, never again


@pytest.mark.parametrize(
    "body,hosts",
    [
        ({"acceleratorType": "v4-8"}, 1),
        ({"acceleratorType": "v5litepod-16"}, 4),
        ({"acceleratorType": "v5p-128"}, 16),
        ({"acceleratorConfig": {"type": "V4", "topology": "2x2x4"}}, 4),
    ],
)
def test_tpu_hosts_per_slice(tpu_server, tpu, body, hosts):
    create_node(tpu, "n", {**body, "runtime_version": "tpu-ubuntu2204-base"})  # snake_case too
    tpu_server.tick(2)
    assert len(get(tpu, "nodes", "n")["networkEndpoints"]) == hosts
    assert len(tpu_server.ready_calls) == hosts


@pytest.mark.parametrize(
    "node_id,body",
    [
        ("ok", {"acceleratorType": "v4-8"}),
        (
            "ok",
            {
                "acceleratorType": "v4-8",
                "runtimeVersion": "r",
                "acceleratorConfig": {"type": "V4", "topology": "2x2x1"},
            },
        ),
        ("ok", {"runtimeVersion": "r"}),
        ("Bad_Id", {"acceleratorType": "v4-8", "runtimeVersion": "r"}),
        ("ok", {"acceleratorType": "v9-8", "runtimeVersion": "r"}),
    ],
)
def test_tpu_create_validation_400(tpu, node_id, body):
    e = http_error(tpu.nodes().create(parent=PARENT, nodeId=node_id, body=body))
    assert e.status_code == 400 and b"INVALID_ARGUMENT" in e.content


def test_tpu_duplicate_409_list_pagination_delete_404(tpu_server, tpu):
    for i in range(5):
        create_node(tpu, f"n{i}")
    e = http_error(tpu.nodes().create(parent=PARENT, nodeId="n0", body=V4))
    assert e.status_code == 409 and b"ALREADY_EXISTS" in e.content
    names, token, pages = [], None, 0
    while True:
        page = tpu.nodes().list(parent=PARENT, pageSize=2, pageToken=token).execute()
        names += [n["name"].rsplit("/", 1)[1] for n in page["nodes"]]
        pages += 1
        if not (token := page.get("nextPageToken")):
            break
    assert (names, pages) == ([f"n{i}" for i in range(5)], 3)
    op = tpu.nodes().delete(name=f"{PARENT}/nodes/n0").execute()
    assert get(tpu, "nodes", "n0")["state"] == "DELETING"
    tpu_server.tick()
    assert tpu.operations().get(name=op["name"]).execute()["done"]
    e = http_error(tpu.nodes().get(name=f"{PARENT}/nodes/n0"))
    assert e.status_code == 404 and e.error_details == f"Resource '{PARENT}/nodes/n0' was not found"
    assert http_error(tpu.nodes().delete(name=f"{PARENT}/nodes/n0")).status_code == 404
    assert http_error(tpu.operations().get(name=f"{PARENT}/operations/nope")).status_code == 404


def test_tpu_stockout_is_an_operation_error_code_8(tpu_server, tpu):
    tpu_server.stockout(Z)
    op = create_node(tpu, "j1-a0")
    tpu_server.tick()
    op = tpu.operations().get(name=op["name"]).execute()
    assert op["done"] and op["error"]["code"] == 8
    assert op["error"]["message"].startswith(f'There is no more capacity in the zone "{Z}"')
    assert http_error(tpu.nodes().get(name=f"{PARENT}/nodes/j1-a0")).status_code == 404
    tpu_server.restock(Z)
    op = create_node(tpu, "j1-a0")
    tpu_server.tick(2)
    assert "response" in tpu.operations().get(name=op["name"]).execute()


def test_tpu_quota_is_a_synchronous_429_with_quota_failure(tpu_server, tpu):
    tpu_server.quota(Z)
    e = http_error(tpu.nodes().create(parent=PARENT, nodeId="a", body=V4))
    assert e.status_code == 429 and b"RESOURCE_EXHAUSTED" in e.content
    detail = e.error_details[0]
    assert detail["@type"] == "type.googleapis.com/google.rpc.QuotaFailure"
    assert "exhausted. Limit 32 in region us-central2" in detail["violations"][0]["description"]
    tpu_server.lift_quota(Z)
    create_node(tpu, "a")


def test_tpu_preemption(tpu_server, tpu):
    create_node(tpu, "spot")
    create_node(tpu, "ondemand", {**V4, "schedulingConfig": {}})
    tpu_server.tick(2)
    tpu_server.preempt("spot")
    assert get(tpu, "nodes", "spot")["state"] == "PREEMPTED"
    tpu_server.tick(5)
    assert get(tpu, "nodes", "spot")["state"] == "PREEMPTED"  # kept until deleted
    with pytest.raises(ValueError):
        tpu_server.preempt("ondemand")
    op = create_node(tpu, "early")  # preempted while CREATING: the create op fails, code 3
    tpu_server.preempt("early")
    op = tpu.operations().get(name=op["name"]).execute()
    assert op["done"] and op["error"]["code"] == 3


def test_tpu_fail_creates_ends_the_create_op_with_that_status(tpu_server, tpu):
    tpu_server.fail_creates(13, "Internal error encountered in {zone}.", zone=Z, times=1)
    op = create_node(tpu, "bad")
    assert op["done"] is False and get(tpu, "nodes", "bad")["state"] == "CREATING"
    tpu_server.tick()
    op = tpu.operations().get(name=op["name"]).execute()
    assert op["done"] and "response" not in op
    assert op["error"] == {"code": 13, "message": f"Internal error encountered in {Z}."}
    assert http_error(tpu.nodes().get(name=f"{PARENT}/nodes/bad")).status_code == 404
    op = create_node(tpu, "good")  # times=1: the next create is not failed
    tpu_server.tick(2)
    assert "response" in tpu.operations().get(name=op["name"]).execute()
    tpu_server.fail_creates(3, "Cloud TPU received a bad request.")  # every zone, every time
    ops = [create_node(tpu, f"n{i}") for i in range(2)]
    tpu_server.tick()
    assert [tpu.operations().get(name=o["name"]).execute()["error"]["code"] for o in ops] == [3, 3]
    tpu_server.fail_creates(None, "")
    op = create_node(tpu, "n9")
    tpu_server.tick(2)
    assert get(tpu, "nodes", "n9")["state"] == "READY"


def test_tpu_maintenance_repairs_then_reruns_every_workers_startup_script(tpu_server, tpu):
    create_node(tpu, "m")
    tpu_server.tick(2)
    assert len(tpu_server.ready_calls) == 4
    create_node(tpu, "young")
    with pytest.raises(ValueError):
        tpu_server.maintenance("young")  # CREATING: not READY
    tpu.nodes().delete(name=f"{PARENT}/nodes/young").execute()
    with pytest.raises(KeyError):
        tpu_server.maintenance("nope")
    tpu_server.maintenance("m")
    node = get(tpu, "nodes", "m")
    assert (node["state"], node["health"]) == ("REPAIRING", "UNHEALTHY_MAINTENANCE")
    assert len(tpu_server.ready_calls) == 4
    tpu_server.tick()
    node = get(tpu, "nodes", "m")
    assert (node["state"], node["health"]) == ("READY", "HEALTHY")
    again = tpu_server.ready_calls[4:]
    assert [(n, i) for n, i, _ in again] == [(f"{PARENT}/nodes/m", i) for i in range(4)]
    assert again[1][2]["startup-script"] == V4["metadata"]["startup-script"]
    tpu_server.tick(3)
    assert len(tpu_server.ready_calls) == 8  # once per worker per boot


def test_tpu_delete_while_creating_fails_the_create_op(tpu_server, tpu):
    op = create_node(tpu, "x")
    tpu.nodes().delete(name=f"{PARENT}/nodes/x").execute()
    tpu_server.tick()
    assert tpu.operations().get(name=op["name"]).execute()["error"]["code"] == 10
    assert http_error(tpu.nodes().get(name=f"{PARENT}/nodes/x")).status_code == 404


def test_tpu_phantom_409_creates_anyway(tpu_server, tpu):
    tpu_server.phantom_409()
    assert http_error(tpu.nodes().create(parent=PARENT, nodeId="x", body=V4)).status_code == 409
    assert get(tpu, "nodes", "x")["state"] == "CREATING"  # adopt it


def test_tpu_rate_limit_and_5xx_are_retried_by_the_client(tpu_server, tpu):
    tpu_server.rate_limit(2)
    assert http_error(tpu.nodes().list(parent=PARENT)).status_code == 429
    assert retried(tpu.nodes().list(parent=PARENT)) == {"nodes": []}
    tpu_server.transient_5xx(3)
    assert retried(tpu.nodes().create(parent=PARENT, nodeId="z", body=V4))["done"] is False


def test_tpu_polls_advance_time():
    with TpuServer(polls_per_tick=1) as server:
        api = build("tpu", "v2", server.endpoint).projects().locations()
        op = create_node(api, "p")
        polls = 0
        while not api.operations().get(name=op["name"]).execute()["done"]:
            polls += 1
        assert polls == 1 and get(api, "nodes", "p")["state"] == "READY"


QR_BODY = {
    "tpu": {
        "nodeSpec": [
            {
                "parent": PARENT,
                "nodeId": "j1-a0",
                "node": {
                    "acceleratorType": "v4-32",
                    "runtimeVersion": "tpu-ubuntu2204-base",
                    "metadata": {"startup-script": "run"},
                },
            }
        ]
    },
    "spot": {},
    "queueingPolicy": {"validUntilDuration": "3600s"},
}


def qr_state(tpu, name="q"):
    return get(tpu, "queuedResources", name)["state"]


def test_qr_lifecycle_dedupe_and_delete(tpu_server, tpu):
    qrs = tpu.queuedResources()
    rid = str(uuid.uuid4())
    op = qrs.create(parent=PARENT, queuedResourceId="q", requestId=rid, body=QR_BODY).execute()
    again = qrs.create(parent=PARENT, queuedResourceId="q", requestId=rid, body=QR_BODY).execute()
    assert again["name"] == op["name"]
    e = http_error(qrs.create(parent=PARENT, queuedResourceId="q", body=QR_BODY))
    assert e.status_code == 409
    tpu_server.stockout(Z)
    seen = [qr_state(tpu)["state"]]
    for _ in range(4):
        tpu_server.tick()
        seen.append(qr_state(tpu)["state"])
    assert seen == ["CREATING", "ACCEPTED"] + ["WAITING_FOR_RESOURCES"] * 3
    assert tpu.operations().get(name=op["name"]).execute()["done"]
    tpu_server.restock(Z)
    tpu_server.tick()
    assert qr_state(tpu)["state"] == "PROVISIONING"
    assert get(tpu, "nodes", "j1-a0")["state"] == "CREATING"
    tpu_server.tick()
    node = get(tpu, "nodes", "j1-a0")
    assert qr_state(tpu)["state"] == "ACTIVE" and node["state"] == "READY"
    assert node["queuedResource"] == f"{PARENT}/queuedResources/q"
    assert [c[1] for c in tpu_server.ready_calls] == [0, 1, 2, 3]
    assert tpu_server.ready_calls[0][2]["startup-script"] == "run"
    listed = qrs.list(parent=PARENT).execute()["queuedResources"]
    assert [q["name"] for q in listed] == [f"{PARENT}/queuedResources/q"]
    e = http_error(qrs.delete(name=f"{PARENT}/queuedResources/q"))
    assert e.status_code == 400 and b"FAILED_PRECONDITION" in e.content
    op = qrs.delete(name=f"{PARENT}/queuedResources/q", force=True).execute()
    assert qr_state(tpu)["state"] == "DELETING"
    tpu_server.tick()
    assert tpu.operations().get(name=op["name"]).execute()["done"]
    assert http_error(qrs.get(name=f"{PARENT}/queuedResources/q")).status_code == 404
    assert http_error(tpu.nodes().get(name=f"{PARENT}/nodes/j1-a0")).status_code == 404


def test_qr_multislice_snake_case(tpu_server, tpu):
    body = {
        "tpu": {
            "node_spec": [
                {
                    "parent": PARENT,
                    "multislice_params": {"node_count": 2, "node_id_prefix": "ms"},
                    "node": {
                        "accelerator_type": "v5litepod-16",
                        "runtime_version": "v2-alpha-tpuv5-lite",
                    },
                }
            ]
        },
        "guaranteed": {},
    }
    tpu.queuedResources().create(parent=PARENT, queuedResourceId="q", body=body).execute()
    tpu_server.tick(4)
    assert qr_state(tpu)["state"] == "ACTIVE"
    assert [get(tpu, "nodes", f"ms-{i}")["state"] for i in range(2)] == ["READY", "READY"]
    assert len(tpu_server.ready_calls) == 8


MS_NODE = {"acceleratorType": "v4-16", "runtimeVersion": "tpu-ubuntu2204-base"}


@pytest.mark.parametrize(
    "specs, says",
    [
        (
            [{"parent": PARENT, "nodeId": f"ms-s{i}", "node": MS_NODE} for i in range(2)],
            "multislice_params must be populated instead",
        ),
        (
            [
                {
                    "parent": PARENT,
                    "nodeId": "ms",
                    "node": MS_NODE,
                    "multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "ms"},
                }
            ],
            "exactly one of node_id",
        ),
        ([{"parent": PARENT, "node": MS_NODE}], "exactly one of node_id"),
        (
            [
                {
                    "parent": PARENT,
                    "node": MS_NODE,
                    "multisliceParams": {"nodeCount": 1, "nodeIdPrefix": "ms"},
                }
            ],
            "greater than 1",
        ),
        (
            [{"parent": PARENT, "node": MS_NODE, "multisliceParams": {"nodeCount": 2}}],
            "node_id_prefix is required",
        ),
    ],
)
def test_qr_node_spec_rule_of_the_api_is_enforced(tpu_server, tpu, specs, says):
    e = http_error(
        tpu.queuedResources().create(
            parent=PARENT, queuedResourceId="q", body={"tpu": {"nodeSpec": specs}}
        )
    )
    assert e.status_code == 400 and b"INVALID_ARGUMENT" in e.content and says in e.reason
    assert tpu_server.qrs == {}


def test_qr_multislice_nodes_carry_their_slice_in_tpu_env(tpu_server, tpu):
    body = {
        "tpu": {
            "nodeSpec": [
                {
                    "parent": PARENT,
                    "node": {**MS_NODE, "metadata": {"startup-script": "run"}},
                    "multisliceParams": {"nodeCount": 2, "nodeIdPrefix": "ms"},
                }
            ]
        }
    }
    tpu.queuedResources().create(parent=PARENT, queuedResourceId="q", body=body).execute()
    tpu_server.tick(4)
    first = get(tpu, "nodes", "ms-0")
    assert first["multisliceNode"] and first["queuedResource"].endswith("/queuedResources/q")
    coordinator = first["networkEndpoints"][0]["ipAddress"]
    envs = [(name.rsplit("/", 1)[1], i, md["tpu-env"]) for name, i, md in tpu_server.ready_calls]
    assert [(n, i) for n, i, _ in envs] == [("ms-0", 0), ("ms-0", 1), ("ms-1", 0), ("ms-1", 1)]
    for node, worker, env in envs:
        for line in (
            f"MEGASCALE_SLICE_ID: '{node[-1]}'",
            "MEGASCALE_NUM_SLICES: '2'",
            f"MEGASCALE_COORDINATOR_ADDRESS: '{coordinator}'",
            f"WORKER_ID: '{worker}'",
        ):
            assert line in env.splitlines(), (node, worker, env)


def test_qr_expiry_fails_with_failed_data(tpu_server, tpu):
    tpu_server.stockout(Z)
    body = {**QR_BODY, "queueingPolicy": {"validUntilDuration": "300s"}}  # 5 ticks of 60 s
    tpu.queuedResources().create(parent=PARENT, queuedResourceId="q", body=body).execute()
    tpu_server.tick(4)
    assert qr_state(tpu)["state"] == "WAITING_FOR_RESOURCES"
    tpu_server.tick()
    state = qr_state(tpu)
    assert state["state"] == "FAILED" and state["failedData"]["error"]["code"] == 8
    tpu.queuedResources().delete(name=f"{PARENT}/queuedResources/q").execute()  # no force needed


def test_qr_fail_creates_turns_it_failed_with_failed_data(tpu_server, tpu):
    tpu_server.fail_creates(13, "Internal error encountered.")
    tpu.queuedResources().create(parent=PARENT, queuedResourceId="q", body=QR_BODY).execute()
    tpu_server.tick(2)
    assert qr_state(tpu)["state"] == "WAITING_FOR_RESOURCES"
    tpu_server.tick()
    assert qr_state(tpu) == {
        "state": "FAILED",
        "stateInitiator": "SERVICE",
        "failedData": {"error": {"code": 13, "message": "Internal error encountered."}},
    }
    assert tpu_server.nodes == {}


def test_qr_preempt_suspends_and_stuck_freezes(tpu_server, tpu):
    tpu.queuedResources().create(parent=PARENT, queuedResourceId="q", body=QR_BODY).execute()
    tpu_server.tick(4)
    tpu_server.preempt("q")
    assert get(tpu, "nodes", "j1-a0")["state"] == "PREEMPTED"
    assert qr_state(tpu)["state"] == "SUSPENDING"
    tpu_server.tick()
    assert qr_state(tpu) == {"state": "SUSPENDED", "stateInitiator": "SERVICE"}
    assert http_error(tpu.nodes().get(name=f"{PARENT}/nodes/j1-a0")).status_code == 404
    tpu.queuedResources().create(
        parent=PARENT,
        queuedResourceId="q2",
        body={**QR_BODY, "tpu": {"nodeSpec": [{**QR_BODY["tpu"]["nodeSpec"][0], "nodeId": "b"}]}},
    ).execute()
    tpu_server.stuck("q2")
    tpu_server.tick(100)
    assert qr_state(tpu, "q2")["state"] == "CREATING"
    tpu_server.stuck("q2", False)
    tpu_server.tick()
    assert qr_state(tpu, "q2")["state"] == "ACCEPTED"


# --- Compute v1 ----------------------------------------------------------------------------
CZ = "us-central1-a"


def vm(name, spot=True, action="STOP", **extra):
    sched = (
        {
            "provisioningModel": "SPOT",
            "instanceTerminationAction": action,
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
        }
        if spot
        else {"onHostMaintenance": "TERMINATE"}
    )
    return {
        "name": name,
        "machineType": f"zones/{CZ}/machineTypes/a2-highgpu-1g",
        "scheduling": sched,
        "labels": {"bastion-job": "j1"},
        "metadata": {"items": [{"key": "startup-script", "value": "#!/bin/bash\necho"}]},
        "networkInterfaces": [{"subnetwork": "regions/us-central1/subnetworks/default"}],
        **extra,
    }


@pytest.fixture
def gce_server():
    calls = []
    server = ComputeServer(on_ready=lambda inst, i, md: calls.append((inst["name"], i, md)))
    server.ready_calls = calls
    with server:
        yield server


@pytest.fixture
def gce(gce_server):
    return build("compute", "v1", gce_server.endpoint)


def insert(gce, body, zone=CZ, **kw):
    return gce.instances().insert(project=P, zone=zone, body=body, **kw).execute()


def op_get(gce, op, zone=CZ):
    return gce.zoneOperations().get(project=P, zone=zone, operation=op["name"]).execute()


def inst(gce, name, zone=CZ):
    return gce.instances().get(project=P, zone=zone, instance=name).execute()


def test_gce_insert_runs_and_calls_on_ready(gce_server, gce):
    op = insert(gce, vm("vm-1"))
    assert (op["kind"], op["operationType"], op["status"]) == (
        "compute#operation",
        "insert",
        "PENDING",
    )
    assert op["targetLink"] == (
        f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{CZ}/instances/vm-1"
    )
    statuses = [inst(gce, "vm-1")["status"]]
    for _ in range(2):
        gce_server.tick()
        statuses.append(inst(gce, "vm-1")["status"])
    assert statuses == ["PROVISIONING", "STAGING", "RUNNING"]
    assert op_get(gce, op)["status"] == "DONE" and "error" not in op_get(gce, op)
    waited = gce.zoneOperations().wait(project=P, zone=CZ, operation=op["name"]).execute()
    assert waited["status"] == "DONE"
    [(name, worker, md)] = gce_server.ready_calls
    assert (name, worker, md["startup-script"]) == ("vm-1", 0, "#!/bin/bash\necho")


@pytest.mark.parametrize(
    "body",
    [
        vm("Bad_Name"),
        vm("x", machineType=f"zones/{CZ}/machineTypes/z9-huge"),
        vm("x", machineType="zones/europe-west4-a/machineTypes/a2-highgpu-1g"),
        vm("x", scheduling={"provisioningModel": "SPOT", "automaticRestart": True}),
        vm("x", spot=False, scheduling={"onHostMaintenance": "MIGRATE"}),
    ],
)
def test_gce_insert_validation_400(gce, body):
    e = http_error(gce.instances().insert(project=P, zone=CZ, body=body))
    assert e.status_code == 400 and e.error_details[0]["reason"] == "invalid"


def test_gce_request_id_dedupe_and_409(gce_server, gce):
    rid = str(uuid.uuid4())
    first = insert(gce, vm("vm-1"), requestId=rid)
    again = insert(gce, vm("vm-1"), requestId=rid)
    assert again["name"] == first["name"] and again["clientOperationId"] == rid
    assert len(gce.instances().list(project=P, zone=CZ).execute()["items"]) == 1
    e = http_error(
        gce.instances().insert(project=P, zone=CZ, body=vm("vm-1"), requestId=str(uuid.uuid4()))
    )
    assert e.status_code == 409 and e.error_details[0]["reason"] == "alreadyExists"
    bad = gce.instances().insert(project=P, zone=CZ, body=vm("vm-2"), requestId="nope")
    assert http_error(bad).status_code == 400


def test_gce_list_filter_pagination_and_aggregated(gce_server, gce):
    for i in range(3):
        insert(gce, vm(f"a{i}"))
        insert(gce, vm(f"b{i}", labels={"bastion-job": "other"}))
    insert(
        gce, vm("c0", machineType="zones/us-east1-b/machineTypes/g2-standard-4"), zone="us-east1-b"
    )
    gce_server.tick(2)
    gce.instances().delete(project=P, zone=CZ, instance="a2").execute()  # STOPPING
    flt = 'labels.bastion-job="j1"'
    names, token = [], None
    while True:
        page = (
            gce.instances()
            .list(project=P, zone=CZ, filter=flt, maxResults=1, pageToken=token)
            .execute()
        )
        names += [i["name"] for i in page["items"]]
        if not (token := page.get("nextPageToken")):
            break
    assert names == ["a0", "a1", "a2"]
    running = gce.instances().list(project=P, zone=CZ, filter=f"({flt}) AND (status = RUNNING)")
    assert [i["name"] for i in running.execute()["items"]] == ["a0", "a1"]
    agg = gce.instances().aggregatedList(project=P, filter=flt, maxResults=2).execute()
    assert sorted(agg["items"]) == [f"zones/{CZ}"] and agg["nextPageToken"]
    agg = gce.instances().aggregatedList(project=P, filter="labels.bastion-job:*").execute()
    assert sorted(agg["items"]) == [f"zones/{CZ}", "zones/us-east1-b"]
    assert len(agg["items"][f"zones/{CZ}"]["instances"]) == 6


def test_gce_stockout_is_an_operation_error(gce_server, gce):
    gce_server.stockout(CZ)
    op = insert(gce, vm("vm-1"))
    gce_server.tick()
    op = op_get(gce, op)
    assert op["status"] == "DONE"
    [err] = op["error"]["errors"]
    assert err["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert err["message"].startswith(f"The zone 'projects/{P}/zones/{CZ}' does not have enough")
    e = http_error(gce.instances().get(project=P, zone=CZ, instance="vm-1"))
    assert e.status_code == 404


def test_gce_quota_is_a_synchronous_403(gce_server, gce):
    gce_server.quota()
    e = http_error(gce.instances().insert(project=P, zone=CZ, body=vm("vm-1")))
    assert e.status_code == 403
    assert e.error_details[0]["reason"] == "quotaExceeded"
    assert "Quota 'NVIDIA_A100_GPUS' exceeded." in e.error_details[0]["message"]


def test_gce_preemption_stop_and_delete(gce_server, gce):
    insert(gce, vm("stop"))
    insert(gce, vm("gone", action="DELETE"))
    insert(gce, vm("std", spot=False))
    gce_server.tick(2)
    gce_server.preempt("stop")
    gce_server.preempt("gone")
    with pytest.raises(ValueError):
        gce_server.preempt("std")
    assert inst(gce, "stop")["status"] == "TERMINATED"
    assert http_error(gce.instances().get(project=P, zone=CZ, instance="gone")).status_code == 404
    link = f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{CZ}/instances/stop"
    flt = f'operationType="compute.instances.preempted" AND targetLink="{link}"'
    [op] = gce.zoneOperations().list(project=P, zone=CZ, filter=flt).execute()["items"]
    assert (op["status"], op["user"]) == ("DONE", "system")
    insert(gce, vm("early"))  # preempted while PROVISIONING: the insert op fails
    gce_server.preempt("early")
    ops = gce.zoneOperations().list(project=P, zone=CZ, filter='operationType="insert"')
    [early] = [o for o in ops.execute()["items"] if o["targetLink"].endswith("/early")]
    assert early["error"]["errors"][0]["code"] == "UNSUPPORTED_OPERATION"


def test_gce_fail_creates_ends_the_insert_op_with_that_error(gce_server, gce):
    gce_server.fail_creates("INTERNAL_ERROR", "Internal error. Please try again.", zone=CZ)
    op = insert(gce, vm("vm-1"))
    gce_server.tick()
    op = op_get(gce, op)
    assert op["status"] == "DONE"
    assert op["error"]["errors"] == [
        {"code": "INTERNAL_ERROR", "message": "Internal error. Please try again."}
    ]
    assert http_error(gce.instances().get(project=P, zone=CZ, instance="vm-1")).status_code == 404
    other = {**vm("vm-2"), "machineType": "zones/us-east1-b/machineTypes/a2-highgpu-1g"}
    insert(gce, other, zone="us-east1-b")  # another zone: not failed
    gce_server.tick(2)
    assert inst(gce, "vm-2", "us-east1-b")["status"] == "RUNNING"


def test_gce_max_run_duration_ends_the_vm_as_its_termination_action_says(gce_server, gce):
    limit = {"maxRunDuration": {"seconds": "90"}}
    insert(gce, vm("del", spot=False))
    insert(gce, vm("stop", spot=False))
    insert(gce, vm("free", spot=False))
    for name, action in (("del", "DELETE"), ("stop", "STOP")):
        key = (P, CZ, name)
        gce_server.instances[key]["scheduling"].update(limit, instanceTerminationAction=action)
    gce_server.tick(2)  # RUNNING at virtual 120 s
    assert {
        i["name"]: i["status"] for i in gce.instances().list(project=P, zone=CZ).execute()["items"]
    } == {"del": "RUNNING", "stop": "RUNNING", "free": "RUNNING"}
    gce_server.tick()  # 60 s later: within 90 s
    assert inst(gce, "del")["status"] == "RUNNING"
    gce_server.tick()  # 120 s: past it
    assert http_error(gce.instances().get(project=P, zone=CZ, instance="del")).status_code == 404
    assert inst(gce, "stop")["status"] == "TERMINATED"
    assert inst(gce, "free")["status"] == "RUNNING"
    flt = 'operationType="compute.instances.preempted"'
    assert gce.zoneOperations().list(project=P, zone=CZ, filter=flt).execute()["items"] == []


def test_gce_delete_then_404(gce_server, gce):
    insert(gce, vm("vm-1"))
    gce_server.tick(2)
    op = gce.instances().delete(project=P, zone=CZ, instance="vm-1").execute()
    assert op["operationType"] == "delete" and inst(gce, "vm-1")["status"] == "STOPPING"
    gce_server.tick()
    assert op_get(gce, op)["status"] == "DONE"
    e = http_error(gce.instances().get(project=P, zone=CZ, instance="vm-1"))
    message = f"The resource 'projects/{P}/zones/{CZ}/instances/vm-1' was not found"
    assert e.status_code == 404
    assert e.error_details == [{"message": message, "domain": "global", "reason": "notFound"}]
    assert (
        http_error(gce.instances().delete(project=P, zone=CZ, instance="vm-1")).status_code == 404
    )


def test_gce_delete_while_provisioning_fails_the_insert_op(gce_server, gce):
    op = insert(gce, vm("vm-1"))
    gce.instances().delete(project=P, zone=CZ, instance="vm-1").execute()
    gce_server.tick()
    assert op_get(gce, op)["error"]["errors"][0]["code"] == "RESOURCE_NOT_FOUND"


def test_gce_rate_limit_and_5xx_are_retried_by_the_client(gce_server, gce):
    gce_server.rate_limit(1)
    e = http_error(gce.instances().list(project=P, zone=CZ))
    assert e.status_code == 429 and e.error_details[0]["reason"] == "rateLimitExceeded"
    gce_server.transient_5xx(2)
    gce_server.rate_limit(1)
    assert (
        retried(gce.instances().insert(project=P, zone=CZ, body=vm("vm-1")))["status"] == "PENDING"
    )
