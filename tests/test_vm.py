"""``bastion vm``: the real googleapiclient against the Compute Engine v1 stand-in."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bastion import vm
from bastion.bucket.store import Store
from bastion.runners.base import root_tag
from tests.conftest import fresh_gcs_root
from tests.standins.compute import ComputeServer

P, Z, NAME = "proj", "us-central1-a", "bastion-1"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def server(monkeypatch):
    with ComputeServer(polls_per_tick=1) as srv:  # every operation wait advances virtual time
        monkeypatch.setenv(vm.ENDPOINT_ENV, srv.endpoint)
        yield srv


@pytest.fixture
def root(tmp_path):
    r = str(tmp_path / "root")
    Store(r)
    return r


def run_cli(verb, root, **kw):
    out, err = io.StringIO(), io.StringIO()
    args = {"name": NAME, "zone": Z, "project": P, "machine_type": "e2-standard-2", **kw}
    code = vm.cli(verb, root=root, out=out, err=err, **args)
    return code, out.getvalue(), err.getvalue()


def snapshot(root: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in Path(root).rglob("*") if p.is_file()}


def test_create_sends_the_daemon_vm_body(server, root):
    code, out, err = run_cli(
        "create",
        root,
        service_account="bastion@proj.iam.gserviceaccount.com",
        image="us-docker.pkg.dev/proj/repo/bastion:1",
    )
    assert code == 0, err
    assert "created" in out
    inst = server.instances[(P, Z, NAME)]
    assert inst["status"] == "RUNNING"
    assert inst["labels"] == {"bastion-root": root_tag(root), "bastion-role": "daemon"}
    assert inst["scheduling"]["automaticRestart"] is True
    assert inst["scheduling"]["onHostMaintenance"] == "MIGRATE"
    assert inst["serviceAccounts"] == [
        {
            "email": "bastion@proj.iam.gserviceaccount.com",
            "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
        }
    ]
    md = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    script = md["startup-script"]
    assert script.startswith("#!/bin/bash")
    assert "--restart=always" in script and f"BASTION_ROOT={root}" in script
    assert "us-docker.pkg.dev/proj/repo/bastion:1 start" in script
    assert "docker-credential-gcr configure-docker --registries=us-docker.pkg.dev" in script
    assert md["bastion-root"] == root
    assert inst["disks"][0]["initializeParams"]["sourceImage"] == vm.COS_IMAGE
    assert inst["machineType"].endswith("/machineTypes/e2-standard-2")
    # The insert carried a requestId derived from the VM: a retry is the same request.
    op = server.ops[inst["_op"]]
    cfg = vm.VmConfig(name=NAME, zone=Z, root=root, project=P)
    assert op["clientOperationId"] == vm.request_id(cfg)
    assert op["status"] == "DONE"


def test_create_without_image_installs_the_package(server, root):
    code, _, err = run_cli("create", root)
    assert code == 0, err
    inst = server.instances[(P, Z, NAME)]
    md = {i["key"]: i["value"] for i in inst["metadata"]["items"]}
    assert "pip install" in md["startup-script"] and "Restart=always" in md["startup-script"]
    assert inst["serviceAccounts"][0]["email"] == "default"
    assert inst["disks"][0]["initializeParams"]["sourceImage"] == vm.DEBIAN_IMAGE


def test_create_twice_is_one_vm(server, root):
    assert run_cli("create", root)[0] == 0
    code, out, err = run_cli("create", root)
    assert code == 0, err
    assert "already exists" in out
    assert [k for k in server.instances if k[2] == NAME] == [(P, Z, NAME)]
    inserts = [o for o in server.ops.values() if o["operationType"] == "insert"]
    assert len(inserts) == 1


def test_repeated_insert_with_the_same_request_id_is_one_vm(server, root):
    """Two creates racing (neither sees the VM yet) send the same requestId: one VM."""
    client, _ = vm.compute_client(P)
    cfg = vm.VmConfig(name=NAME, zone=Z, root=root, project=P)
    body, rid = vm.instance_body(cfg), vm.request_id(cfg)
    ops = [
        client.instances().insert(project=P, zone=Z, body=body, requestId=rid).execute()
        for _ in range(2)
    ]
    assert ops[0]["name"] == ops[1]["name"]
    assert len(server.instances) == 1


def test_conflict_409_is_reported_as_already_exists(server, root):
    """A VM made by another request id (e.g. by hand) answers 409: success when it is ours."""
    cfg = vm.VmConfig(name=NAME, zone=Z, root=root, project=P)
    client, _ = vm.compute_client(P)
    client.instances().insert(project=P, zone=Z, body=vm.instance_body(cfg)).execute()
    server.tick(2)
    real_get = vm._get
    calls = []

    def get_none_first(client, cfg):  # the VM appears between our look and our insert
        calls.append(1)
        return None if len(calls) == 1 else real_get(client, cfg)

    vm._get = get_none_first
    try:
        code, out, err = run_cli("create", root)
    finally:
        vm._get = real_get
    assert code == 0, err
    assert "already exists" in out


def test_a_vm_of_another_root_is_not_taken_for_ours(server, root, tmp_path):
    assert run_cli("create", str(tmp_path / "other"))[0] == 0
    code, _, err = run_cli("create", root)
    assert code == 1
    assert "pick another --vm_name" in err and len(err.strip().splitlines()) == 1


def test_status_before_and_after_a_lease(server, root):
    code, out, err = run_cli("status", root)
    assert code == 0, err
    assert "does not exist" in out and "never held" in out
    assert run_cli("create", root)[0] == 0
    code, out, _ = run_cli("status", root)
    assert f"vm: {NAME}  status: RUNNING  zone: {Z}  machine type: e2-standard-2" in out
    assert "daemon on this VM holds the lease: no" in out
    store = Store(root)
    record = {
        "host": NAME,
        "pid": 4242,
        "renewed": time.time(),
        "duration": 60.0,
        "owner": f"{NAME}:4242:abc",
    }
    store.lease.write(record, None)
    code, out, _ = run_cli("status", root)
    assert f"lease: held by {NAME} pid 4242" in out and "(current)" in out
    assert "daemon on this VM holds the lease: yes" in out
    # Held by another host: not this VM's daemon.
    token = store.lease.read()[1]
    store.lease.write({**record, "host": "laptop"}, token)
    assert "holds the lease: no" in run_cli("status", root)[1]
    # A stale lease (not renewed for longer than its duration) is not held.
    token = store.lease.read()[1]
    store.lease.write({**record, "renewed": time.time() - 600}, token)
    out = run_cli("status", root)[1]
    assert "expired or released" in out and "holds the lease: no" in out


def test_delete_removes_the_vm_and_leaves_the_root_alone(server, root):
    assert run_cli("create", root)[0] == 0
    Store(root).lease.write({"host": NAME, "pid": 1, "renewed": time.time()}, None)
    Path(root, "jobs", "active", "j1").write_text("spec")
    before = snapshot(root)
    code, out, err = run_cli("delete", root)
    assert code == 0, err
    assert "deleted" in out and "untouched" in out
    assert (P, Z, NAME) not in server.instances
    assert snapshot(root) == before
    code, out, _ = run_cli("delete", root)
    assert code == 0 and "already gone" in out
    # Create after delete: the remembered requestId must not swallow the new insert.
    code, out, err = run_cli("create", root)
    assert code == 0, err
    assert "created" in out and (P, Z, NAME) in server.instances


def test_delete_refuses_a_vm_that_is_not_a_daemon(server, root):
    client, _ = vm.compute_client(P)
    body = {"name": NAME, "machineType": f"zones/{Z}/machineTypes/e2-small"}
    client.instances().insert(project=P, zone=Z, body=body).execute()
    server.tick(2)
    code, _, err = run_cli("delete", root)
    assert code == 1 and "not a bastion daemon VM" in err
    assert (P, Z, NAME) in server.instances


@pytest.mark.parametrize(
    ("inject", "machine_type", "words"),
    [
        ("stockout", "e2-standard-2", ["stockout", "--zone=", "--machine_type=e2-standard-2"]),
        ("quota", "e2-standard-2", ["quota exceeded", "--machine_type", "--zone"]),
        (None, "e2-huge-999", ["bad --machine_type=e2-huge-999", "machine-types list"]),
    ],
)
def test_errors_are_one_line_naming_the_field(server, root, inject, machine_type, words):
    if inject:
        getattr(server, inject)(Z)
    code, _, err = run_cli("create", root, machine_type=machine_type)
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("bastion: error: vm create:")
    for w in words:
        assert w in err, err
    assert (P, Z, NAME) not in server.instances


def test_bad_vm_name_is_one_line(server, root):
    code, _, err = run_cli("create", root, name="Bad_Name")
    assert code == 1 and "bad --vm_name=Bad_Name" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_vm_create_refuses_a_local_directory_root(server, root):
    env = {**os.environ, vm.ENDPOINT_ENV: server.endpoint, "BASTION_ROOT": root}
    flags = [f"--vm_name={NAME}", f"--zone={Z}", f"--project={P}"]
    done = subprocess.run(
        [sys.executable, "-m", "launch.cli", "vm", "create", *flags],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"the root {root} is a directory on this machine" in done.stderr
    assert "--root=gs://" in done.stderr
    assert not server.instances  # nothing was created


def test_cli_verb_end_to_end(server, gcs_emulator):
    root = fresh_gcs_root("vm")
    env = {**os.environ, vm.ENDPOINT_ENV: server.endpoint, "BASTION_ROOT": root}
    base = [sys.executable, "-m", "launch.cli", "vm"]
    flags = [f"--vm_name={NAME}", f"--zone={Z}", f"--project={P}"]
    done = subprocess.run(
        [*base, "create", *flags], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "created" in done.stdout
    done = subprocess.run(
        [*base, "status", *flags], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "status: RUNNING" in done.stdout
    done = subprocess.run(
        [*base, "delete", *flags], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "deleted" in done.stdout, done.stderr


def test_a_gpu_machine_type_does_not_ask_for_live_migration(server, root):
    code, _, err = run_cli("create", root, machine_type="g2-standard-4")
    assert code == 0, err
    sched = server.instances[(P, Z, NAME)]["scheduling"]
    assert sched == {
        "provisioningModel": "STANDARD",
        "automaticRestart": True,
        "onHostMaintenance": "TERMINATE",
    }
