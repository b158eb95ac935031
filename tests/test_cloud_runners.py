"""The TPU VM and GCE runners against the stand-ins (tests/standins), through the real
googleapiclient, with the real agent: when a node or VM turns ready, the stand-in's on_ready
hook runs its startup script as a local process per worker, each with its own metadata server
(``GCE_METADATA_HOST``) carrying that worker's ``agent-worker-number``; the agents write to a
local-directory root. Virtual cloud time moves with ``tick()`` between polls; agents run in
real time, so every wait is bounded."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from googleapiclient.errors import HttpError

from bastion.bucket.store import Store
from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Fenced,
    Observation,
    RunnerError,
    TryAgain,
    attempt_name,
)
from bastion.runners.google.gce import GceRunner, request_id
from bastion.runners.google.queued import QueuedRunner, node_prefix
from bastion.runners.google.tpu import TpuRunner
from tests.conftest import fresh_gcs_root
from tests.harness import REPO, kill_all, processes_with_env
from tests.standins.compute import ComputeServer
from tests.standins.metadata import MetadataServer
from tests.standins.tpu import TpuServer

P, ZA, ZB = "proj", "us-central2-b", "europe-west4-a"
FAST = ["--chunk_seconds=0.2", "--heartbeat_seconds=0.3", "--grace_seconds=3"]


class Guests:
    """The VMs' workers: a startup script process and a metadata server per worker."""

    def __init__(self, tmp_path):
        self.tag = uuid.uuid4().hex
        self.tmp = tmp_path
        self.workers: dict[str, list[tuple[subprocess.Popen, MetadataServer]]] = {}

    def on_ready(self, resource: dict, worker: int, metadata: dict) -> None:
        name = resource["name"].rsplit("/", 1)[-1]
        attributes = {"agent-worker-number": str(worker)}
        if "tpu-env" in metadata:  # a TPU VM's runtime variables (a multislice's MEGASCALE_*)
            attributes["tpu-env"] = metadata["tpu-env"]
        md = MetadataServer(attributes).start()
        env = dict(os.environ, GCE_METADATA_HOST=md.host, CLOUD_TEST_TAG=self.tag)
        if emulator := os.environ.get("STORAGE_EMULATOR_HOST"):  # the VM's gcloud: this bucket
            env.update(
                CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE=f"{emulator}/storage/v1/",
                CLOUDSDK_AUTH_DISABLE_CREDENTIALS="True",
                CLOUDSDK_CORE_PROJECT=P,
                CLOUDSDK_CONFIG=str(self.tmp / "gcloud-config"),
            )
        out = open(self.tmp / f"{name}.{worker}.boot", "wb")  # noqa: SIM115 (closed by the child)
        proc = subprocess.Popen(
            ["bash", "-c", metadata["startup-script"]],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        out.close()
        self.workers.setdefault(name, []).append((proc, md))

    def console(self, name: str) -> bytes:
        """What worker 0 of ``name`` printed so far: its VM's console (the Compute stand-in's
        serial port output)."""
        path = self.tmp / f"{name}.0.boot"
        return path.read_bytes() if path.exists() else b""

    def preempt(self, name: str) -> None:
        for _, md in self.workers[name]:
            md.preempt()

    def shutdown(self, name: str) -> None:
        """The VMs' power-off: SIGTERM to each agent (it forwards and flushes)."""
        for proc, _ in self.workers.get(name, []):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    def wait(self, name: str, timeout: float = 30) -> list[int]:
        return [proc.wait(timeout) for proc, _ in self.workers[name]]

    def close(self) -> None:
        for procs in self.workers.values():
            for proc, md in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
                md.stop()
        kill_all(processes_with_env("CLOUD_TEST_TAG", self.tag))


@pytest.fixture
def guests(tmp_path):
    g = Guests(tmp_path)
    yield g
    g.close()


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "root")


@pytest.fixture(params=["local", "gcs"])
def any_root(request, tmp_path):
    """A local directory, and gs:// on the GCS emulator (the agents inherit its address)."""
    if request.param == "gcs":
        request.getfixturevalue("gcs_emulator")
        return fresh_gcs_root()
    return str(tmp_path / "root")


def settings(root: str, endpoint: str, **more) -> dict:
    return {
        "root": root,
        "project": P,
        "zones": [ZA, ZB],
        "api_endpoint": endpoint,
        "python": sys.executable,
        "agent_args": FAST,
        "listing_ttl": 0,
        "heartbeat_timeout": 30,
        **more,
    }


def attempt(root: str, command: str, n: int = 1, job: str = "train", **options) -> Attempt:
    return Attempt(
        name=attempt_name(root, job, "sub1", n, "run"),
        job=job,
        attempt=n,
        command=command,
        env={"GREETING": "it's a 'test'"},
        options=options,
    )


def poll_until(runner, handle, server, want, timeout: float = 60) -> Observation:
    """Poll (ticking the cloud) until the phase is in ``want``; bounded."""
    deadline = time.monotonic() + timeout
    while True:
        seen = runner.poll(handle)
        if seen.phase in want:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"still {seen} after {timeout}s")
        server.tick()
        time.sleep(0.1)


def creates(server, kind: str = "nodes") -> list:
    return [r for r in server.requests if r[0] == "POST" and r[1].endswith("/" + kind)]


def lists(server, kind: str = "nodes") -> list:
    return [r for r in server.requests if r[0] == "GET" and r[1].endswith("/" + kind)]


def no_sleep(runner):
    runner.sleep = lambda _s: None
    return runner


# --- TPU VM --------------------------------------------------------------------------------
@pytest.fixture
def tpu_server(guests):
    with TpuServer(on_ready=guests.on_ready) as server:
        yield server


@pytest.fixture
def tpu(root, tpu_server):
    runner = no_sleep(TpuRunner(settings(root, tpu_server.endpoint)))
    yield runner
    runner.close()


V4 = {"accelerator_type": "v4-32", "spot": True}


@pytest.fixture
def tpu_any(any_root, tpu_server):
    runner = no_sleep(TpuRunner(settings(any_root, tpu_server.endpoint)))
    yield runner
    runner.close()


def test_tpu_happy_path_four_workers(any_root, tpu_server, tpu_any, guests):
    root, tpu = any_root, tpu_any
    a = attempt(
        root,
        'echo "hello from $BASTION_WORKER of $BASTION_NUM_WORKERS: $GREETING"',
        instance_type="tpu-v4-32",
        spot=True,
    )
    handle = tpu.start(a)
    assert (handle["zone"], handle["workers"]) == (ZA, 4)
    assert Store(root).runs.read_provision("train", a.name)["zone"] == ZA
    assert tpu.poll(handle).phase is AttemptPhase.PROVISIONING
    body = creates(tpu_server)[0][3]
    assert body["labels"] == {
        "bastion-root": tpu.tag,
        "bastion-runner": "tpu",
        "bastion-attempt-name": a.name,
        "bastion-job": "train",
        "bastion-attempt": "1",
    }
    assert body["acceleratorType"] == "v4-32" and body["schedulingConfig"] == {"spot": True}
    seen = poll_until(tpu, handle, tpu_server, {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED})
    done = ("exit 0",) * 4
    assert seen == Observation(AttemptPhase.SUCCEEDED, "all 4 workers exited 0", 0, workers=done)
    assert len(guests.workers[a.name]) == 4 and guests.wait(a.name) == [0, 0, 0, 0]
    assert tpu.read_output(handle, 0, 1 << 20) == b"hello from 0 of 4: it's a 'test'\n"
    records = tpu.channel.records(handle)
    for w in range(4):
        expected = f"hello from {w} of 4: it's a 'test'\n".encode()
        assert records.read_output(0, 100, worker=w) == expected
    assert tpu.delete(handle) is False  # delete issued, not yet verified gone
    tpu_server.tick()
    assert tpu.delete(handle) is True
    with pytest.raises(HttpError) as e:
        tpu.client.nodes().get(name=f"projects/{P}/locations/{ZA}/nodes/{a.name}").execute()
    assert e.value.status_code == 404


def test_tpu_start_twice_is_one_node_and_restart_adopts(root, tpu_server, tpu):
    a = attempt(root, "true", **V4)
    first = tpu.start(a)
    assert tpu.start(a) == first
    assert len(creates(tpu_server)) == 1 and len(tpu_server.nodes) == 1
    # a daemon restarted with no memory: the node is found by label, the zone by the record
    restarted = no_sleep(TpuRunner(settings(root, tpu_server.endpoint, zones=[ZB, ZA])))
    owned = {o.name: o for o in restarted.list_owned()}
    assert owned[a.name].handle["zone"] == ZA and owned[a.name].handle["job"] == "train"
    assert owned[a.name].handle["workers"] == 4 and not owned[a.name].finished
    again = restarted.start(a)
    assert again["zone"] == ZA and len(creates(tpu_server)) == 1
    assert restarted.poll(again).phase is AttemptPhase.PROVISIONING


def test_tpu_phantom_409_is_adopted(root, tpu_server, tpu):
    tpu_server.phantom_409()
    a = attempt(root, "true", **V4)
    handle = tpu.start(a)
    assert handle["zone"] == ZA and len(creates(tpu_server)) == 1
    assert tpu.poll(handle).phase is AttemptPhase.PROVISIONING  # the node that the 409 hid


def test_tpu_stockout_blocks_the_zone_next_attempt_in_the_next(root, tpu_server, tpu):
    tpu_server.stockout(ZA)
    a1 = attempt(root, "true", 1, **V4)
    h1 = tpu.start(a1)
    tpu_server.tick()
    seen = tpu.poll(h1)
    assert (seen.phase, seen.retryable, seen.exit_code) == (AttemptPhase.FAILED, True, None)
    assert seen.reason.startswith(f"stockout in {ZA}: There is no more capacity")
    h2 = tpu.start(attempt(root, "true", 2, **V4))  # the daemon requeues: a new name
    assert h2["zone"] == ZB
    assert [r[1].split("/")[5] for r in creates(tpu_server)] == [ZA, ZB]


def test_tpu_quota_blocks_the_region_without_a_hot_loop(root, tpu_server, tpu):
    tpu_server.quota()  # every zone
    a = attempt(root, "true", **V4)
    with pytest.raises(TryAgain) as e:
        tpu.start(a)
    assert "quota TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI exhausted" in str(e.value)
    assert f"(zone {ZA})" in str(e.value) and f"(zone {ZB})" in str(e.value)
    assert len(creates(tpu_server)) == 2  # one per region, none retried
    for _ in range(3):
        with pytest.raises(TryAgain, match="quota"):
            tpu.start(a)
    assert len(creates(tpu_server)) == 2  # blocked: no call at all


def test_tpu_spot_preemption_while_running(root, tpu_server, tpu, guests):
    a = attempt(root, "for i in $(seq 1 100000); do echo line $i; sleep 0.02; done", **V4)
    handle = tpu.start(a)
    poll_until(tpu, handle, tpu_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while tpu.poll(handle).reason != "4 of 4 workers running" or b"line 5\n" not in tpu.read_output(
        handle, 0, 1 << 20
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    guests.preempt(a.name)  # the metadata notice, then the node turns PREEMPTED
    tpu_server.preempt(a.name)
    seen = tpu.poll(handle)  # PREEMPTED only once every agent has flushed its exit record
    assert seen.phase is AttemptPhase.RUNNING and seen.reason.endswith("the agents are flushing")
    seen = poll_until(
        tpu, handle, tpu_server, {AttemptPhase.PREEMPTED, AttemptPhase.FAILED}, timeout=30
    )
    assert (seen.phase, seen.retryable) == (AttemptPhase.PREEMPTED, True)
    assert guests.wait(a.name) == [143] * 4 or all(c != 0 for c in guests.wait(a.name))
    out = tpu.read_output(handle, 0, 1 << 24).decode()
    n = out.count("\n")
    assert n >= 5 and out == "".join(f"line {i}\n" for i in range(1, n + 1))  # complete prefix
    exit_record = Store(root).agents.read("train", a.name, 0, "exit")
    assert exit_record["preempted"] is True and exit_record["output_bytes"] == len(out)
    tpu.stop(handle, time.time() + 30)
    tpu_server.tick()
    assert tpu.delete(handle) is True


def test_tpu_one_worker_fails(root, tpu_server, tpu, guests):
    a = attempt(root, 'if [ "$BASTION_WORKER" = 2 ]; then echo bad; exit 1; fi; sleep 60', **V4)
    handle = tpu.start(a)
    seen = poll_until(tpu, handle, tpu_server, {AttemptPhase.FAILED, AttemptPhase.SUCCEEDED})
    assert (seen.phase, seen.reason, seen.exit_code) == (
        AttemptPhase.FAILED,
        "worker 2 exited with status 1",
        1,
    )
    assert seen.workers[2] == "exit 1"
    tpu.stop(handle, time.time() + 30)  # the daemon stops the others: the node is deleted
    assert tpu_server.nodes[f"projects/{P}/locations/{ZA}/nodes/{a.name}"]["state"] == "DELETING"
    guests.shutdown(a.name)
    codes = guests.wait(a.name)
    # worker 2 exited 1 (its agent may still be exiting when the power-off SIGTERM lands)
    assert codes[2] in (1, -15) and all(c in (143, -15) for i, c in enumerate(codes) if i != 2)
    assert tpu.poll(handle).exit_code == 1  # still the first failure, node going away


def test_tpu_orphans_labelled_listed_unlabelled_not(root, tpu_server, tpu):
    api = tpu.client.nodes()
    parent = f"projects/{P}/locations/{ZB}"
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base"}
    api.create(
        parent=parent,
        nodeId="orphan",
        body={
            **body,
            "labels": {"bastion-root": tpu.tag},
            "metadata": {"bastion-job-name": "gone"},
        },
    ).execute()
    api.create(parent=parent, nodeId="someone-elses", body=body).execute()
    api.create(
        parent=parent, nodeId="other-root", body={**body, "labels": {"bastion-root": "ffffff"}}
    ).execute()
    owned = tpu.list_owned()
    assert [(o.name, o.handle["job"], o.handle["zone"]) for o in owned] == [("orphan", "gone", ZB)]
    assert tpu.delete(owned[0].handle) is False
    tpu_server.tick()
    assert tpu.delete(owned[0].handle) is True
    assert sorted(n.rsplit("/", 1)[1] for n in tpu_server.nodes) == ["other-root", "someone-elses"]


def test_tpu_429_and_5xx_bursts_are_retried(root, tpu_server, tpu):
    tpu_server.transient_5xx(3)
    handle = tpu.start(attempt(root, "true", **V4))
    assert len(tpu_server.nodes) == 1
    tpu_server.rate_limit(4)
    assert tpu.poll(handle).phase is AttemptPhase.PROVISIONING
    tpu_server.transient_5xx(10)  # more than num_retries (5): the error surfaces, bounded
    with pytest.raises(HttpError):
        tpu.poll(handle)


def test_tpu_listing_pages_and_one_list_per_zone_per_cycle(root, tpu_server):
    runner = no_sleep(TpuRunner(settings(root, tpu_server.endpoint, listing_ttl=5, page_size=7)))
    handles = [runner.start(attempt(root, "true", n, job=f"j{n}", **V4)) for n in range(20)]
    assert {h["zone"] for h in handles} == {ZA}
    before = len(tpu_server.requests)
    assert all(runner.poll(h).phase is AttemptPhase.PROVISIONING for h in handles)
    asked = tpu_server.requests[before:]
    assert len(asked) == 3 and all(r[1].endswith("/nodes") for r in asked)  # 20 nodes, 3 pages
    assert len({o.name for o in runner.list_owned()}) == 20


def test_tpu_preempted_while_creating(root, tpu_server, tpu):
    handle = tpu.start(attempt(root, "true", **V4))
    tpu_server.preempt(handle["name"])
    seen = tpu.poll(handle)
    assert (seen.phase, seen.retryable) == (AttemptPhase.PREEMPTED, True)


# --- GCE GPU VM ----------------------------------------------------------------------------
@pytest.fixture
def gce_server(guests):
    with ComputeServer(on_ready=guests.on_ready) as server:
        yield server


@pytest.fixture
def gce(root, gce_server):
    runner = no_sleep(GceRunner(settings(root, gce_server.endpoint, max_run_seconds=86400)))
    yield runner
    runner.close()


A3 = {"instance_type": "gpu-a3-highgpu-8g", "spot": True}


def inserts(server, zone: str | None = None) -> list:
    return [r for r in creates(server, "instances") if zone is None or f"/zones/{zone}/" in r[1]]


def test_gce_never_owns_the_daemons_own_vm_of_the_same_root(root, gce_server, gce):
    """bastion/vm.py labels the daemon's VM ``bastion-root`` (and ``bastion-role: daemon``):
    it is no attempt, so the sweep must never see it as an orphan to delete."""
    a = attempt(root, "true", **A3)
    gce.start(a)
    ((_, _, _, body),) = inserts(gce_server)
    labels = {"bastion-root": gce.tag, "bastion-role": "daemon"}
    gce.client.instances().insert(
        project=P, zone=ZA, body={**body, "name": "bastion-daemon", "labels": labels}
    ).execute()
    gce_server.tick()
    assert sorted(o.name for o in gce.list_owned()) == [a.name]


def test_gce_happy_path(root, gce_server, gce, guests):
    a = attempt(root, 'echo "gpu $BASTION_WORKER/$BASTION_NUM_WORKERS: $GREETING"', **A3)
    handle = gce.start(a)
    assert (handle["zone"], handle["workers"]) == (ZA, 1)
    ((_, _, query, body),) = inserts(gce_server)
    assert query["requestId"] == request_id(root, a.name)
    assert body["machineType"] == f"zones/{ZA}/machineTypes/a3-highgpu-8g"
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": {"seconds": "86400"},
    }
    assert body["labels"]["bastion-root"] == gce.tag
    assert gce.poll(handle).phase is AttemptPhase.PROVISIONING
    seen = poll_until(gce, handle, gce_server, {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED})
    assert seen == Observation(
        AttemptPhase.SUCCEEDED, "its worker exited 0", 0, workers=("exit 0",)
    )
    assert gce.read_output(handle, 0, 1 << 20) == b"gpu 0/1: it's a 'test'\n"
    assert [o.name for o in gce.list_owned()] == [a.name]
    assert gce.delete(handle) is False
    gce_server.tick()
    assert gce.delete(handle) is True and not gce_server.instances


def test_gce_retried_insert_is_deduplicated_by_request_id(root, gce_server, gce):
    a = attempt(root, "true", **A3)
    handle = gce.start(a)
    ((_, _, query, body),) = inserts(gce_server)
    # the same insert again, as after a lost answer: the server returns the first operation
    again = (
        gce.client.instances()
        .insert(project=P, zone=ZA, body=body, requestId=query["requestId"])
        .execute()
    )
    assert again["name"] == handle["op"] and len(gce_server.instances) == 1
    restarted = no_sleep(GceRunner(settings(root, gce_server.endpoint)))
    assert restarted.start(a)["zone"] == ZA and len(inserts(gce_server)) == 2  # adopted


def test_gce_stockout_then_next_zone(root, gce_server, gce):
    gce_server.stockout(ZA)
    h1 = gce.start(attempt(root, "true", 1, **A3))
    gce_server.tick()
    seen = gce.poll(h1)
    assert (seen.phase, seen.retryable) == (AttemptPhase.FAILED, True)
    assert seen.reason.startswith(f"stockout in {ZA}: The zone 'projects/{P}/zones/{ZA}'")
    assert gce.start(attempt(root, "true", 2, **A3))["zone"] == ZB


def test_gce_quota_blocks_the_region(root, gce_server, gce):
    gce_server.quota(ZA)
    h1 = gce.start(attempt(root, "true", 1, **A3))
    assert h1["zone"] == ZB  # ZA's region blocked, ZB in another region
    h2 = gce.start(attempt(root, "true", 2, **A3))
    assert h2["zone"] == ZB and len(inserts(gce_server, ZA)) == 1
    gce_server.quota(ZB)
    with pytest.raises(TryAgain, match=r"quota NVIDIA_H100_GPUS exhausted in region europe-west4"):
        gce.start(attempt(root, "true", 3, **A3))


def test_gce_preemption_via_the_preempted_operation(root, gce_server, gce, guests):
    a = attempt(root, "for i in $(seq 1 100000); do echo line $i; sleep 0.02; done", **A3)
    handle = gce.start(a)
    poll_until(gce, handle, gce_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while b"line 3\n" not in gce.read_output(handle, 0, 1 << 20):
        assert time.monotonic() < deadline
        gce.poll(handle)
        time.sleep(0.1)
    guests.preempt(a.name)
    gce_server.preempt(a.name)  # DELETE action: the VM is gone, a preempted op remains
    seen = poll_until(
        gce, handle, gce_server, {AttemptPhase.PREEMPTED, AttemptPhase.FAILED}, timeout=30
    )
    assert (seen.phase, seen.retryable) == (AttemptPhase.PREEMPTED, True)
    guests.wait(a.name)
    out = gce.read_output(handle, 0, 1 << 24).decode()
    n = out.count("\n")
    assert n >= 3 and out == "".join(f"line {i}\n" for i in range(1, n + 1))
    assert gce.delete(handle) is True  # already gone: 404 is success


def test_tpu_worker_stops_heartbeating_is_lost(root, tpu_server, guests):
    runner = no_sleep(TpuRunner(settings(root, tpu_server.endpoint, heartbeat_timeout=2)))
    a = attempt(root, "sleep 60", **V4)
    handle = runner.start(a)
    poll_until(runner, handle, tpu_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while runner.poll(handle).reason != "4 of 4 workers running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc, _ = guests.workers[a.name][1]
    proc.kill()  # the agent of worker 1 dies without a word (its command lives on, orphaned)
    seen = poll_until(runner, handle, tpu_server, {AttemptPhase.LOST}, timeout=20)
    assert seen.retryable and seen.reason.startswith("worker 1 stopped heartbeating")


# --- TPU queued resources ------------------------------------------------------------------
@pytest.fixture
def qr(root, tpu_server):
    runner = no_sleep(QueuedRunner(settings(root, tpu_server.endpoint, queue_seconds=600)))
    yield runner
    runner.close()


def qr_creates(server) -> list:
    return creates(server, "queuedResources")


def test_qr_lifecycle_to_succeeded(root, tpu_server, qr, guests):
    a = attempt(root, 'echo "qr $BASTION_WORKER/$BASTION_NUM_WORKERS"', **V4)
    handle = qr.start(a)
    assert (handle["zone"], handle["workers"]) == (ZA, 4)
    ((_, path, query, body),) = qr_creates(tpu_server)
    assert path == f"/v2/projects/{P}/locations/{ZA}/queuedResources"
    assert query["queuedResourceId"] == a.name
    assert query["requestId"] == request_id(qr.root, a.name, "create")
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "600s"}
    (spec,) = body["tpu"]["nodeSpec"]
    assert spec["parent"] == f"projects/{P}/locations/{ZA}" and spec["nodeId"] == a.name
    assert spec["node"]["acceleratorType"] == "v4-32"
    assert spec["node"]["labels"]["bastion-root"] == qr.tag
    assert "startup-script" in spec["node"]["metadata"]
    assert qr.poll(handle) == Observation(AttemptPhase.QUEUED, f"waiting for capacity in {ZA}")
    seen = poll_until(qr, handle, tpu_server, {AttemptPhase.PROVISIONING})
    assert seen.reason == f"provisioning in {ZA}"
    seen = poll_until(qr, handle, tpu_server, {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED})
    done = ("exit 0",) * 4
    assert seen == Observation(AttemptPhase.SUCCEEDED, "all 4 workers exited 0", 0, workers=done)
    assert qr.read_output(handle, 0, 100) == b"qr 0/4\n"
    assert [o.name for o in qr.list_owned()] == [a.name]
    assert qr.delete(handle) is False
    deletes = [r for r in tpu_server.requests if r[0] == "DELETE"]
    assert deletes[-1][2]["force"] == "true"
    tpu_server.tick()
    assert qr.delete(handle) is True and not tpu_server.qrs and not tpu_server.nodes


def test_qr_past_its_deadline_fails_retryable_and_blocks_the_zone(root, tpu_server, guests):
    runner = no_sleep(QueuedRunner(settings(root, tpu_server.endpoint, queue_seconds=120)))
    tpu_server.stockout(ZA)  # the request waits in ZA's queue, then its validUntil passes
    h1 = runner.start(attempt(root, "true", 1, **V4))
    seen = poll_until(runner, h1, tpu_server, {AttemptPhase.FAILED, AttemptPhase.SUCCEEDED})
    assert (seen.phase, seen.retryable, seen.exit_code) == (AttemptPhase.FAILED, True, None)
    assert seen.reason.startswith(f"stockout in {ZA}: ") and "validUntil" in seen.reason
    assert runner.list_owned()[0].finished
    assert runner.delete(h1) is False
    tpu_server.tick()
    assert runner.delete(h1) is True
    h2 = runner.start(attempt(root, "true", 2, **V4))  # the daemon's requeue: next zone
    assert h2["zone"] == ZB


def test_qr_suspended_by_the_service_is_preempted(root, tpu_server, qr, guests):
    a = attempt(root, "for i in $(seq 1 100000); do echo line $i; sleep 0.02; done", **V4)
    handle = qr.start(a)
    poll_until(qr, handle, tpu_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while b"line 3\n" not in qr.read_output(handle, 0, 1 << 20):
        assert time.monotonic() < deadline
        qr.poll(handle)
        time.sleep(0.1)
    guests.preempt(a.name)
    tpu_server.preempt(a.name)  # SUSPENDING by SERVICE, its nodes PREEMPTED
    seen = poll_until(
        qr, handle, tpu_server, {AttemptPhase.PREEMPTED, AttemptPhase.FAILED}, timeout=30
    )
    assert (seen.phase, seen.retryable) == (AttemptPhase.PREEMPTED, True)
    assert "by the service" in seen.reason
    out = qr.read_output(handle, 0, 1 << 24).decode()
    n = out.count("\n")
    assert n >= 3 and out == "".join(f"line {i}\n" for i in range(1, n + 1))
    assert Store(root).agents.read("train", a.name, 0, "exit")["output_bytes"] == len(out)


def test_qr_retried_create_is_deduplicated_by_request_id(root, tpu_server, qr):
    a = attempt(root, "true", **V4)
    handle = qr.start(a)
    ((_, _, query, body),) = qr_creates(tpu_server)
    again = (
        qr.client.queuedResources()
        .create(
            parent=f"projects/{P}/locations/{ZA}",
            queuedResourceId=a.name,
            requestId=query["requestId"],
            body=body,
        )
        .execute()
    )
    assert again["name"] == handle["op"] and len(tpu_server.qrs) == 1
    restarted = no_sleep(QueuedRunner(settings(root, tpu_server.endpoint)))
    assert restarted.start(a)["zone"] == ZA and len(qr_creates(tpu_server)) == 2  # adopted
    tpu_server.phantom_409()
    b = attempt(root, "true", 2, **V4)
    assert restarted.start(b)["zone"] == ZA and len(tpu_server.qrs) == 2  # 409: adopted


SLICE_ECHO = (
    'echo "w $BASTION_WORKER of $BASTION_NUM_WORKERS slice $BASTION_SLICE of $BASTION_NUM_SLICES'
    ' megascale $MEGASCALE_SLICE_ID of $MEGASCALE_NUM_SLICES at $MEGASCALE_COORDINATOR_ADDRESS"'
)


def test_qr_multislice_is_one_node_spec_and_every_worker_knows_its_slice(
    root, tpu_server, qr, guests
):
    a = attempt(root, SLICE_ECHO, accelerator_type="v4-16", num_replicas=2)
    handle = qr.start(a)
    assert handle["workers"] == 4
    (spec,) = qr_creates(tpu_server)[0][3]["tpu"]["nodeSpec"]
    assert "nodeId" not in spec
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": a.name}
    seen = poll_until(qr, handle, tpu_server, {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED})
    done = ("exit 0",) * 4
    assert seen == Observation(AttemptPhase.SUCCEEDED, "all 4 workers exited 0", 0, workers=done)
    assert sorted(guests.workers) == [f"{a.name}-0", f"{a.name}-1"]
    first = tpu_server.nodes[f"projects/{P}/locations/{ZA}/nodes/{a.name}-0"]
    coordinator = first["networkEndpoints"][0]["ipAddress"]
    records = qr.channel.records(handle)
    assert [records.read_output(0, 200, worker=w) for w in range(4)] == [
        f"w {w} of 4 slice {w // 2} of 2 megascale {w // 2} of 2 at {coordinator}\n".encode()
        for w in range(4)
    ]


def test_node_prefix_leaves_room_for_every_slice_and_keeps_names_apart():
    assert node_prefix("bst-x-a1", 2) == "bst-x-a1"
    for n in (2, 10, 100):
        assert len(f"{node_prefix('x' * 63, n)}-{n - 1}") <= 63
    assert node_prefix("x" * 63, 2) != node_prefix("x" * 62 + "y", 2)


def test_qr_made_by_an_older_daemon_with_a_spec_per_slice_is_adopted_counted_and_deleted(
    root, tpu_server, qr, tpu
):
    """Before multisliceParams, a multislice attempt was one nodeSpec per slice with ids
    ``<name>-s<i>`` and no runner label: the tpu-qr runner still owns, polls and deletes it
    (its workers counted over the specs), and the tpu runner never takes its nodes."""
    a = attempt(root, "true", accelerator_type="v4-16", num_replicas=2)
    node = {
        "acceleratorType": "v4-16",
        "runtimeVersion": "tpu-ubuntu2204-base",
        "labels": {"bastion-root": qr.tag, "bastion-job": "train", "bastion-attempt": "1"},
        "metadata": {"bastion-job-name": "train", "startup-script": "true"},
    }
    parent = f"projects/{P}/locations/{ZA}"
    body = {
        "tpu": {
            "nodeSpec": [
                {"parent": parent, "nodeId": f"{a.name}-s{i}", "node": node} for i in range(2)
            ]
        },
        "spot": {},
    }
    tpu_server.accept_spec_per_slice = True
    qr.client.queuedResources().create(parent=parent, queuedResourceId=a.name, body=body).execute()
    tpu_server.tick(4)  # ACTIVE, both slices' nodes READY
    assert sorted(n.rsplit("/", 1)[1] for n in tpu_server.nodes) == [f"{a.name}-s0", f"{a.name}-s1"]
    ((owned, workers),) = [(o.name, o.handle["workers"]) for o in qr.list_owned()]
    assert (owned, workers) == (a.name, 4)
    assert [o.name for o in tpu.list_owned()] == []  # queuedResource: the queued resource's
    handle = qr.start(a)
    assert len(qr_creates(tpu_server)) == 1 and handle["workers"] == 4  # adopted
    assert qr.poll(handle) == Observation(
        AttemptPhase.RUNNING, "waiting for workers to start (0 of 4)"
    )
    assert qr.delete(handle) is False
    tpu_server.tick()
    assert qr.delete(handle) is True and tpu_server.nodes == {} and tpu_server.qrs == {}


def test_tpu_runner_never_owns_a_node_of_a_queued_resource(root, tpu_server, qr, tpu):
    """Both runners on one zone: the nodes of a queued resource (labelled runner tpu-qr, named
    ``<prefix>-<i>``, the API's ``queuedResource`` set) are no attempt of the tpu runner."""
    b = attempt(root, "true", 2, accelerator_type="v4-8")
    own = tpu.start(b)
    a = attempt(root, "true", accelerator_type="v4-16", num_replicas=2)
    qr.start(a)
    tpu_server.tick(4)
    assert len(tpu_server.nodes) == 3
    listed = [(o.name, o.handle["name"]) for o in tpu.list_owned() if o.handle["zone"]]
    assert listed == [(b.name, own["name"])]
    assert [o.name for o in qr.list_owned() if o.handle["zone"]] == [a.name]


# --- the daemon's own package for a bare VM ------------------------------------------------
def test_daemon_package_is_published_content_addressed_and_installs(root, tpu_server, tmp_path):
    runner = no_sleep(TpuRunner({**settings(root, tpu_server.endpoint), "python": "python3"}))
    runner.start(attempt(root, "true", **V4))
    script = creates(tpu_server)[0][3]["metadata"]["startup-script"]
    (wheel,) = (Path(root) / "packages").glob("*/*.whl")
    assert wheel.parent.name == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert re.fullmatch(r"bastion-[\d.]+\+[0-9a-f]{12}-py3-none-any\.whl", wheel.name)
    assert shlex.quote(runner.package_url()) in script and "pip install" in script
    mtime = wheel.stat().st_mtime_ns
    again = no_sleep(TpuRunner(settings(root, tpu_server.endpoint)))  # a restarted daemon
    assert again.package_url() == runner.package_url() and wheel.stat().st_mtime_ns == mtime
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            f"--target={target}",
            str(wheel),
        ],
        check=True,
    )
    out = subprocess.run(
        [sys.executable, "-c", "import bastion.agent, bastion; print(bastion.__file__)"],
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(target / "bastion" / "__init__.py")
    assert (
        no_sleep(
            TpuRunner(settings(root, tpu_server.endpoint, publish_package=False))
        ).package_url()
        is None
    )


# -- capacity per quota tier: reserved within quota, spot when borrowing -----------------------


def _tiered(a: Attempt, tier: int | None) -> Attempt:
    return dataclasses.replace(a, tier=tier)


def test_the_tier_a_job_was_admitted_on_picks_its_capacity(root, tpu_server):
    tiers = {"0": "reserved", "1": "spot"}
    runner = no_sleep(TpuRunner(settings(root, tpu_server.endpoint, tiers=tiers)))
    try:
        plain = {"accelerator_type": "v4-8"}
        runner.start(_tiered(attempt(root, "true", n=1, **plain), 0))  # within its quota
        runner.start(_tiered(attempt(root, "true", n=2, **plain), 1))  # borrowing
        runner.start(_tiered(attempt(root, "true", n=3, accelerator_type="v4-8", spot=False), 1))
        runner.start(_tiered(attempt(root, "true", n=4, **plain), 7))  # a tier not listed
        bodies = [r[3] for r in creates(tpu_server)]
        assert [b.get("schedulingConfig") for b in bodies] == [
            {"reserved": True},
            {"spot": True},
            None,  # the job's own --spot=false wins over its tier
            None,  # not listed: the runner's default (on-demand)
        ]
    finally:
        runner.close()


def test_a_gce_tier_names_a_reservation_or_spot(root, gce_server):
    tiers = {0: "reservation:team-a3", 1: "spot"}
    runner = no_sleep(GceRunner(settings(root, gce_server.endpoint, tiers=tiers)))
    try:
        a3 = {"instance_type": "gpu-a3-highgpu-8g"}
        runner.start(_tiered(attempt(root, "true", n=1, **a3), 0))
        runner.start(_tiered(attempt(root, "true", n=2, **a3), 1))
        reserved, spot = (r[3] for r in inserts(gce_server))
        assert reserved["reservationAffinity"] == {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": ["team-a3"],
        }
        assert "provisioningModel" not in reserved["scheduling"]
        assert spot["scheduling"]["provisioningModel"] == "SPOT"
        assert "reservationAffinity" not in spot
    finally:
        runner.close()


def test_a_tier_setting_that_means_nothing_is_the_jobs_error_naming_the_setting(root, tpu_server):
    runner = no_sleep(TpuRunner(settings(root, tpu_server.endpoint, tiers={"1": "cheap"})))
    try:
        with pytest.raises(RunnerError, match=r"tiers\.1 = 'cheap' is not spot, on-demand"):
            runner.start(_tiered(attempt(root, "true", accelerator_type="v4-8"), 1))
        assert creates(tpu_server) == []
    finally:
        runner.close()


def test_a_stale_daemon_does_not_create_after_a_newer_lease_term(root, tpu_server, tpu):
    """The TPU API takes no fencing token: the runner reads the lease just before a create."""
    Store(root).lease.write({"owner": "newer", "term": 5}, None)
    stale = dataclasses.replace(attempt(root, "true", accelerator_type="v4-8"), fence=3)
    with pytest.raises(Fenced, match="lease term 5 is newer than this daemon's 3"):
        tpu.start(stale)
    assert creates(tpu_server) == []
    current = dataclasses.replace(stale, fence=5)
    assert tpu.start(current)["name"] == stale.name and len(creates(tpu_server)) == 1


# -- operation errors while creating: preemption, a bad request, backoff ----------------------


@pytest.mark.parametrize(
    ("message", "phase", "retryable"),
    [
        (
            "Cloud TPU received a bad request. update is not supported while in state PREEMPTED",
            AttemptPhase.PREEMPTED,
            True,
        ),
        ("The node was preempted while it was being created.", AttemptPhase.PREEMPTED, True),
        (
            "Cloud TPU received a bad request. Runtime version 'tpu-nope' is not supported.",
            AttemptPhase.FAILED,
            False,
        ),
    ],
)
def test_tpu_create_op_code_3_is_a_preemption_only_when_its_message_says_so(
    root, tpu_server, tpu, message, phase, retryable
):
    tpu_server.fail_creates(3, message, zone=ZA, times=1)
    handle = tpu.start(attempt(root, "true", 1, **V4))
    tpu_server.tick()  # the create operation ends with code 3 INVALID_ARGUMENT
    seen = tpu.poll(handle)
    assert (seen.phase, seen.retryable, seen.exit_code) == (phase, retryable, None)
    assert seen.reason.endswith(message) and ZA in seen.reason
    assert tpu.poll(handle) == seen  # polled again: the same, and counted once
    nxt = tpu.start(attempt(root, "true", 2, **V4))
    # a preemption while creating backs its zone off; a bad request says nothing of the zone
    assert nxt["zone"] == (ZB if retryable else ZA)
    if retryable:
        assert tpu.blocks.failures(ZA) == 1
        assert f"(1 failed create in {ZA}: backing off 30 s)" in tpu.blocks.reason(ZA)
    else:
        assert tpu.blocks.reason(ZA) is None and tpu.blocks.failures(ZA) == 0


def test_tpu_preempted_while_creating_backs_the_zone_off(root, tpu_server, tpu):
    handle = tpu.start(attempt(root, "true", 1, **V4))
    tpu_server.preempt(handle["name"])  # the stand-in's own: code 3 "... in state PREEMPTED"
    tpu_server.tick(2)  # the PREEMPTED node is kept until deleted
    assert tpu.delete(handle) is False
    tpu_server.tick()
    seen = tpu.poll(handle)
    assert (seen.phase, seen.retryable) == (AttemptPhase.PREEMPTED, True)
    assert seen.reason.startswith(f"preempted while creating in {ZA}: ")
    assert tpu.start(attempt(root, "true", 2, **V4))["zone"] == ZB


def test_a_create_cut_short_by_our_own_stop_does_not_back_the_zone_off(root, tpu_server, tpu):
    handle = tpu.start(attempt(root, "true", 1, **V4))
    tpu.stop(handle, time.time() + 30)  # cancelled while CREATING: the create op fails (10)
    tpu_server.tick()
    seen = tpu.poll(handle)
    assert (seen.phase, seen.retryable) == (AttemptPhase.FAILED, True)
    assert "error code 10: " in seen.reason
    assert tpu.blocks.reason(ZA) is None and tpu.blocks.failures(ZA) == 0
    assert tpu.start(attempt(root, "true", 2, **V4))["zone"] == ZA


def test_gce_spot_vm_preempted_while_provisioning_is_preempted_and_backs_off(root, gce_server, gce):
    h1 = gce.start(attempt(root, "true", 1, **A3))
    assert gce_server.instances[(P, ZA, h1["name"])]["status"] == "PROVISIONING"
    gce_server.preempt(h1["name"])  # insert op: UNSUPPORTED_OPERATION; the spot VM is deleted
    ops = [o for o in gce_server.ops.values() if o["operationType"] == "insert"]
    assert ops[0]["error"]["errors"][0]["code"] == "UNSUPPORTED_OPERATION"
    seen = gce.poll(h1)
    assert (seen.phase, seen.retryable, seen.exit_code) == (AttemptPhase.PREEMPTED, True, None)
    assert seen.reason.startswith(f"preempted while creating in {ZA}: ")
    assert "was preempted during creation" in seen.reason
    assert gce.delete(h1) is True  # gone already
    assert gce.start(attempt(root, "true", 2, **A3))["zone"] == ZB


# -- GCE: the dead man's switch ------------------------------------------------------------------


def test_gce_insert_carries_a_seven_day_dead_mans_switch_by_default(root, gce_server):
    default = no_sleep(GceRunner(settings(root, gce_server.endpoint)))
    off = no_sleep(GceRunner(settings(root, gce_server.endpoint, max_run_seconds=0)))
    try:
        default.start(attempt(root, "true", 1, instance_type="gpu-a3-highgpu-8g"))
        off.start(attempt(root, "true", 2, instance_type="gpu-a3-highgpu-8g"))
        on_demand, unlimited = (r[3]["scheduling"] for r in inserts(gce_server))
        assert on_demand == {
            "onHostMaintenance": "TERMINATE",
            "automaticRestart": False,
            "instanceTerminationAction": "DELETE",
            "maxRunDuration": {"seconds": "604800"},
        }
        assert unlimited == {"onHostMaintenance": "TERMINATE", "automaticRestart": False}
    finally:
        default.close()
        off.close()


def test_gce_vm_ended_by_its_dead_mans_switch_fails_the_job_naming_max_run_seconds(
    root, gce_server, guests
):
    runner = no_sleep(GceRunner(settings(root, gce_server.endpoint, max_run_seconds=2)))
    try:
        a = attempt(root, "echo started; sleep 120", instance_type="gpu-a3-highgpu-8g")
        handle = runner.start(a)
        gce_server.tick(2)  # RUNNING: the agent starts
        deadline = time.monotonic() + 30
        while runner.poll(handle).reason != "1 of 1 workers running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(max(0.0, handle["created"] + 2.1 - time.time()))
        gce_server.tick()  # maxRunDuration passed: the service deletes the VM (DELETE action)
        assert (P, ZA, a.name) not in gce_server.instances
        guests.shutdown(a.name)  # its power-off: the agent gets SIGTERM and flushes
        ended = {
            AttemptPhase.FAILED,
            AttemptPhase.LOST,
            AttemptPhase.PREEMPTED,
            AttemptPhase.SUCCEEDED,
        }
        seen = poll_until(runner, handle, gce_server, ended)
        assert (seen.phase, seen.retryable, seen.exit_code) == (AttemptPhase.FAILED, False, None)
        assert "reached max_run_seconds (2 s)" in seen.reason
        assert "dead man's switch" in seen.reason and a.name in seen.reason
        assert Store(root).agents.read("train", a.name, 0, "exit") is not None  # flushed
        assert runner.read_output(handle, 0, 100) == b"started\n"
        assert runner.delete(handle) is True
    finally:
        runner.close()


def test_gce_vm_gone_before_its_max_run_is_lost_not_the_switch(root, gce_server, gce):
    a = attempt(root, "true", **A3)
    handle = gce.start(a)
    gce_server.tick(2)  # RUNNING, its insert operation DONE
    with gce_server.lock:  # gone without a preemption, well within max_run_seconds (1 day)
        del gce_server.instances[(P, ZA, a.name)]
    seen = gce.poll(handle)
    assert (seen.phase, seen.retryable) == (AttemptPhase.LOST, True)


# -- TPU maintenance: the startup script runs again, the command does not -----------------------


def test_tpu_maintenance_reruns_the_startup_script_but_never_the_command(
    root, tpu_server, tpu, guests, tmp_path
):
    marks, go = tmp_path / "runs", tmp_path / "go"
    marks.mkdir()
    command = (
        f"echo run >> {marks}/$BASTION_WORKER; "
        f'while [ ! -e {go} ]; do sleep 0.1; done; echo "w$BASTION_WORKER done"'
    )
    a = attempt(root, command, **V4)
    handle = tpu.start(a)
    poll_until(tpu, handle, tpu_server, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 30
    while tpu.poll(handle).reason != "4 of 4 workers running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    tpu_server.maintenance(a.name)  # REPAIRING, health UNHEALTHY_MAINTENANCE
    seen = tpu.poll(handle)
    assert seen.phase is AttemptPhase.RUNNING and seen.workers == ("running",) * 4
    assert seen.reason == (
        f"4 of 4 workers running; TPU node REPAIRING (UNHEALTHY_MAINTENANCE) in {ZA}"
    )
    tpu_server.tick()  # READY again: every worker's startup script runs again
    node = tpu_server.nodes[f"projects/{P}/locations/{ZA}/nodes/{a.name}"]
    assert (node["state"], node["health"]) == ("READY", "HEALTHY")
    assert len(guests.workers[a.name]) == 8
    for proc, _ in guests.workers[a.name][4:]:  # the second agents: claimed already, exit 0
        assert proc.wait(60) == 0
    go.touch()
    seen = poll_until(
        tpu, handle, tpu_server, {AttemptPhase.SUCCEEDED, AttemptPhase.FAILED, AttemptPhase.LOST}
    )
    assert seen.phase is AttemptPhase.SUCCEEDED and seen.workers == ("exit 0",) * 4
    assert {p.name: p.read_text() for p in marks.iterdir()} == {
        str(w): "run\n" for w in range(4)
    }  # each worker's command ran once
    assert tpu.read_output(handle, 0, 100) == b"w0 done\n"


def test_tpu_repairing_before_any_agent_started_is_provisioning(root, tpu_server, tpu):
    handle = tpu.start(attempt(root, "true", **V4))
    with tpu_server.lock:  # READY without agents (the stand-in's hook is not run here)
        node = tpu_server.nodes[f"projects/{P}/locations/{ZA}/nodes/{handle['name']}"]
        node.update(state="REPAIRING", health="UNHEALTHY_MAINTENANCE", _left=5)
    seen = tpu.poll(handle)
    assert seen == Observation(
        AttemptPhase.PROVISIONING, f"TPU node REPAIRING (UNHEALTHY_MAINTENANCE) in {ZA}"
    )


# -- deleting what is already gone; listings of more than one page -----------------------------


def test_delete_of_an_already_gone_tpu_node_or_queued_resource_is_success(
    root, tpu_server, tpu, qr
):
    node_handle = tpu.start(attempt(root, "true", 1, **V4))
    qr_handle = qr.start(attempt(root, "true", 2, **V4))
    tpu.client.nodes().delete(
        name=f"projects/{P}/locations/{ZA}/nodes/{node_handle['name']}"
    ).execute()
    tpu.client.queuedResources().delete(
        name=f"projects/{P}/locations/{ZA}/queuedResources/{qr_handle['name']}", force=True
    ).execute()
    tpu_server.tick()  # both gone by others' hands
    assert not tpu_server.nodes and not tpu_server.qrs
    before = len(tpu_server.requests)
    assert tpu.delete(node_handle) is True
    assert qr.delete(qr_handle) is True
    asked = [(m, p.rsplit("/", 1)[-1]) for m, p, _, _ in tpu_server.requests[before:]]
    assert asked == [("GET", "nodes"), ("GET", "queuedResources")]  # a listing each, no DELETE


def test_gce_listing_pages_through_the_runner(root, gce_server):
    runner = no_sleep(GceRunner(settings(root, gce_server.endpoint, page_size=2, listing_ttl=5)))
    try:
        handles = [runner.start(attempt(root, "true", n, job=f"j{n}", **A3)) for n in range(5)]
        assert {h["zone"] for h in handles} == {ZA}
        before = len(gce_server.requests)
        assert all(runner.poll(h).phase is AttemptPhase.PROVISIONING for h in handles)
        asked = gce_server.requests[before:]  # one listing for the 5 polls: 3 pages of 2
        assert [(m, p.rsplit("/", 1)[-1]) for m, p, _, _ in asked] == [("GET", "instances")] * 3
        assert [q.get("pageToken") for _, _, q, _ in asked] == [None, "2", "4"]
        assert all(q["maxResults"] == "2" for _, _, q, _ in asked)
        assert sorted(o.name for o in runner.list_owned()) == sorted(h["name"] for h in handles)
    finally:
        runner.close()


# --- the startup script checks its interpreter first ------------------------------------------


@pytest.fixture(scope="session")
def old_python(tmp_path_factory) -> str:
    """Debian 11's ``/usr/bin/python3`` (3.9, on which the agent's dependencies do not
    install): a real Python 3.9 where this machine has one (pyenv), else a program that
    answers the script's version query as that interpreter would."""
    found = sorted(Path("/root/.pyenv/versions").glob("3.9.*/bin/python3.9"))
    if found:
        return str(found[0])
    fake = tmp_path_factory.mktemp("py39") / "python3"
    fake.write_text("#!/bin/sh\necho 3.9.2\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.fixture(scope="session")
def no_pip_python(tmp_path_factory) -> str:
    """A bare image's ``python3`` without ``python3-pip`` (Debian and Ubuntu ship pip apart):
    a real, new enough interpreter in a virtual environment made without pip, with none of
    the agent's dependencies, so the agent must be installed and cannot be."""
    where = tmp_path_factory.mktemp("nopip") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    return str(where / "bin" / "python")


@pytest.mark.parametrize("case", ["too_old", "no_pip"])
def test_the_startup_script_fails_fast_naming_the_python_setting(
    case, root, guests, tpu_server, old_python, no_pip_python
):
    """An interpreter that cannot run the agent: the script exits 1 at once with one line
    naming the settings to change (not minutes later inside a pip install, or never), and
    the attempt fails at the start deadline with that line in its reason."""
    python = old_python if case == "too_old" else no_pip_python
    said = (
        f"the python setting {python} is Python 3.9"
        if case == "too_old"
        else f"the python setting {python} has no pip"
    )
    runner = no_sleep(
        TpuRunner(settings(root, tpu_server.endpoint, python=python, start_timeout_seconds=2))
    )
    handle = runner.start(attempt(root, "echo never", accelerator_type="v4-8"))
    seen = poll_until(runner, handle, tpu_server, {AttemptPhase.RUNNING})
    assert seen.reason == "waiting for workers to start (0 of 1)"
    assert guests.wait(handle["name"]) == [1]
    boot = guests.console(handle["name"]).decode()
    (line,) = [x for x in boot.splitlines() if said in x]
    assert "set the runner setting python" in line and "runtime_version (tpu)" in line
    seen = poll_until(runner, handle, tpu_server, {AttemptPhase.FAILED}, timeout=30)
    assert seen.retryable and seen.exit_code is None
    assert seen.reason.startswith("worker 0 did not start within 2 s of its TPU node coming up")
    assert said in seen.reason and "set the runner setting python" in seen.reason
