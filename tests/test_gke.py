"""The gke runner end to end through the daemon, against a REAL kube-apiserver (1.20.2 with etcd
and the garbage collector, tests/kube_cluster.py) through the official kubernetes client.

The daemon runs in-process (``cycle`` then ``settle``); tests/kube_cluster.py ``Cluster`` plays
the JobSet controller and the kubelet against the real API and runs each pod's container
command (the real agent) as a local process writing to a local-directory root, so output and
exit records flow through the bucket as on GKE. Never skipped: a build that fails fails these.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bastion.bucket.runs import parse_run_name
from bastion.bucket.store import Store
from bastion.daemon import SWEEP_EVERY_CYCLES, Daemon
from bastion.daemon.start import build_daemon
from bastion.runners.base import Attempt, RunnerError, attempt_name
from bastion.runners.gke import MAX_JOBSET_NAME, GkeRunner, jobset_name, refusal
from launch.api import Client, new_jobspec
from tests.kube_cluster import Cluster, KubeServer
from tests.runner_contract import RunnerContract

QUOTA = """[toml-schema]
version = "1"
[total_resources]
v5p = 1024
gpu = 64
cpu = 64
[project_membership]
default = [".*"]
[project_resources.default]
v5p = 1.0
gpu = 1.0
cpu = 1.0
"""
FAST = ["--chunk_seconds=0.2", "--heartbeat_seconds=0.3", "--grace_seconds=3"]
LOOP = "for i in $(seq 1 100000); do echo line $i; sleep 0.02; done"


class Gke:
    """A root, the real apiserver with its played controllers, and daemons on them."""

    def __init__(self, tmp: Path, kube: KubeServer, cluster: Cluster) -> None:
        self.tmp, self.kube, self.cluster = tmp, kube, cluster
        self.root = tmp / "root"
        self.client = Client(str(self.root), expect_daemon=False)
        (self.root / "project-quotas").mkdir(parents=True, exist_ok=True)
        (self.root / "project-quotas" / "project-quotas.config").write_text(QUOTA)
        self.daemons: list[Daemon] = []
        self.settings: dict[str, Any] = {
            "kubeconfig": kube.kubeconfig,
            "namespace": "default",
            "image": "bastion:test",
            "python": sys.executable,
            "publish_package": False,
            "agent_args": FAST,
            "listing_ttl": 0,
            "heartbeat_timeout": 30,
            "flush_seconds": 15,
            "termination_grace_seconds": 5,
        }

    def daemon(self, work: str = "work", **more: Any) -> Daemon:
        settings = {"default_runner": "local", "runners": {"gke": {**self.settings, **more}}}
        daemon = build_daemon(
            str(self.root), work_dir=str(self.tmp / work), gpus=[], settings=settings
        )
        self.daemons.append(daemon)
        return daemon

    @staticmethod
    def runner(daemon: Daemon) -> GkeRunner:
        runner = daemon.runners.get("gke")
        assert isinstance(runner, GkeRunner)
        return runner

    def submit(
        self, name: str, command: str, resources: dict[str, int] | None = None, **options: Any
    ) -> None:
        runner = {"kind": "gke", "instance_type": "tpu-v5p-8", **options}
        self.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources=resources or {"v5p": 8},
                runner=runner,
            )
        )

    def step(self, daemon: Daemon) -> None:
        daemon.cycle(time.time())
        daemon.settle()

    def drive(
        self, daemon: Daemon, done: Callable[[], bool], what: str, timeout: float = 90
    ) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                states = {n: (self.info(n).status, self.info(n).reason) for n in self.names()}
                raise AssertionError(
                    f"timed out waiting for {what}: {states}; JobSets "
                    f"{sorted(self.cluster.jobsets())}"
                )
            self.step(daemon)
            time.sleep(0.1)

    def names(self) -> list[str]:
        states = self.root / "jobs" / "states"
        return (
            sorted(p.name for p in states.iterdir() if not p.name.startswith("."))
            if states.exists()
            else []
        )

    def finished(self, name: str) -> bool:
        return (self.root / "jobs" / "complete" / name).exists()

    def info(self, name: str) -> Any:
        return self.client.get(name)

    def runner_record(self, name: str) -> dict[str, Any]:
        """The run attempt's record as the bucket holds it (JSON key "runner"); {}: none."""
        state = self.client.get(name).state
        record = state.run_attempt if state else None
        return record.to_json() if record is not None else {}

    def log(self, name: str) -> str:
        path = self.root / "logs" / name
        return path.read_text() if path.exists() else ""

    def history(self, name: str) -> list[tuple[str, str]]:
        return [(e["event"], e["reason"]) for e in self.client.history(name)]

    def attempts(self, job: str) -> list[str]:
        """The attempt names of the job's JobSets the cluster saw, in order."""
        return sorted(
            (a for a in self.cluster.attempts.values() if f"-{job}-" in a),
            key=lambda a: int(a.rsplit("-a", 1)[1]),
        )

    def worker_output(self, job: str, attempt: str, worker: int) -> str:
        """The worker's output chunks (they outlive the attempt's agent records)."""
        store = Store(str(self.root))
        listing = store.runs.list(job, attempt)
        chunks = sorted(
            p[2] for n in listing if (p := parse_run_name(n)) and p[0] == worker and p[1] == "log"
        )
        return b"".join(store.runs.read_chunk(job, attempt, worker, seq) for seq in chunks).decode()

    def close(self) -> None:
        for daemon in self.daemons:
            daemon.close()


@pytest.fixture
def gke(tmp_path: Path, kube: KubeServer, cluster: Cluster) -> Iterator[Gke]:
    g = Gke(tmp_path, kube, cluster)
    try:
        yield g
    finally:
        g.close()


def jobset_gone(gke: Gke, name: str) -> Callable[[], bool]:
    return lambda: name not in gke.cluster.jobsets()


# -- names ------------------------------------------------------------------------------------


def test_jobset_name_leaves_room_for_the_longest_pod_name() -> None:
    long_job = "a-very-long-training-job-name-that-goes-on-and-on-forever"
    name = attempt_name("gs://bucket/root", long_job, "sub-1", 12, "run")
    assert len(name) > MAX_JOBSET_NAME
    short = jobset_name(name)
    assert len(short) <= MAX_JOBSET_NAME and short.endswith("-a12")
    assert len(f"{short}-job-9999-9999-abcde") <= 63
    assert short.startswith(name[:10]) and jobset_name(name) == short  # deterministic
    other = attempt_name("gs://bucket/root", long_job + "-2", "sub-1", 12, "run")
    assert jobset_name(other) != short  # the hash of the full job name is kept


# -- 1. a 2-slice TPU job: the manifest field by field, all workers' output ------------------


def test_tpu_multislice_jobset_manifest_and_every_workers_output(gke: Gke) -> None:
    command = 'echo "w $BASTION_WORKER of $BASTION_NUM_WORKERS slice $MEGASCALE_SLICE_ID"'
    gke.submit("train", command, resources={"v5p": 32}, instance_type="tpu-v5p-16", num_replicas=2)
    daemon = gke.daemon(
        queue="team-a", tiers={"0": "reservation:res-a", "1": "spot"}, service_account="trainer"
    )
    gke.drive(daemon, lambda: gke.finished("train"), "train to finish")
    info = gke.info("train")
    assert (info.status, info.state.attempt, info.state.exit_code) == ("SUCCEEDED", 1, 0)
    (attempt,) = gke.attempts("train")
    runner = gke.runner(daemon)
    spec = gke.client.get("train").spec
    body = gke.cluster.stored[jobset_name(attempt)]  # as the apiserver stored the create
    meta = body["metadata"]
    assert (body["apiVersion"], body["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert meta["name"] == jobset_name(attempt) and meta["namespace"] == "default"
    assert meta["labels"]["bastion-root"] == runner.tag
    assert meta["labels"]["bastion-runner"] == "gke"
    assert meta["labels"]["bastion-attempt-name"] == attempt
    assert meta["labels"]["bastion-job"] == "train" and meta["labels"]["bastion-attempt"] == "1"
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "kueue.x-k8s.io/queue-name" not in meta["annotations"]
    assert meta["annotations"]["bastion-job-name"] == "train"
    assert body["spec"]["failurePolicy"] == {"maxRestarts": 0}
    (rjob,) = body["spec"]["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("job", 2)
    job = rjob["template"]["spec"]
    assert (job["parallelism"], job["completions"], job["backoffLimit"]) == (2, 2, 0)
    assert job["completionMode"] == "Indexed"
    pod = job["template"]["spec"]
    assert job["template"]["metadata"]["labels"]["bastion-attempt-name"] == attempt
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
        "cloud.google.com/reservation-name": "res-a",  # tier 0 -> the reservation
    }
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == "trainer"
    (container,) = pod["containers"]
    assert container["image"] == "bastion:test"
    assert container["resources"] == {"limits": {"google.com/tpu": "4"}}
    assert container["command"][:2] == ["bash", "-c"]
    script = container["command"][2]
    assert "-m bastion.agent" in script and "--num_workers=4" in script
    assert "--num_slices=2" in script and "--slices_from_env" in script
    env = {e["name"]: e for e in container["env"]}
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['jobset.sigs.k8s.io/job-index']"
    )
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "2"
    coordinator = f"{meta['name']}-job-0-0.{meta['name']}"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == coordinator
    # The tier borrowed beyond quota gets spot: the node selector and its toleration.
    spot = runner.manifest(
        Attempt(
            name=attempt, job="train", attempt=1, command="x", env={}, options=spec.runner, tier=1
        )
    )["spec"]["replicatedJobs"][0]
    spot_pod = spot["template"]["spec"]["template"]["spec"]
    assert spot_pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert {
        "key": "cloud.google.com/gke-spot",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    } in spot_pod["tolerations"]
    # Every worker ran with its own index and slice, and wrote its own output.
    outputs = [gke.worker_output("train", attempt, w) for w in range(4)]
    assert outputs == [f"w {w} of 4 slice {w // 2}\n" for w in range(4)]
    history = gke.history("train")
    assert (
        "PLACED",
        f"attempt 1 on JobSet {meta['name']} (tpu-v5p-slice 2x2x2, 2 hosts x 2 "
        "slices) in namespace default",
    ) in history
    gke.drive(daemon, jobset_gone(gke, meta["name"]), "the JobSet to be deleted")
    assert "DELETED" in [e for e, _ in gke.history("train")]


# -- 2. a GPU job; one worker exits 3 ---------------------------------------------------------


def test_gpu_job_one_worker_exits_3_fails_with_3(gke: Gke) -> None:
    gke.submit(
        "ft",
        'if [ "$BASTION_WORKER" = 1 ]; then echo bad; exit 3; fi; sleep 60',
        resources={"gpu": 16},
        instance_type="gpu-a3-highgpu-8g",
        num_replicas=2,
    )
    daemon = gke.daemon()
    gke.drive(daemon, lambda: gke.finished("ft"), "ft to finish")
    info = gke.info("ft")
    assert (info.status, info.state.exit_code, info.state.attempt) == ("FAILED", 3, 1)
    assert "worker 1 exited with status 3" in info.reason
    (attempt,) = gke.attempts("ft")
    name = jobset_name(attempt)
    gke.drive(daemon, jobset_gone(gke, name), "the JobSet to be deleted")
    assert not gke.cluster.pods(name)  # Foreground: the garbage collector took the pods


def test_gpu_job_succeeds_with_its_log(gke: Gke) -> None:
    gke.submit(
        "gpu",
        'echo "gpu worker $BASTION_WORKER"',
        resources={"gpu": 8},
        instance_type="gpu-a3-highgpu-8g",
    )
    daemon = gke.daemon()
    gke.drive(daemon, lambda: gke.finished("gpu"), "gpu to finish")
    assert gke.info("gpu").status == "SUCCEEDED"
    assert "gpu worker 0\n" in gke.log("gpu")


# -- 3. a spot eviction requeues as attempt 2 -------------------------------------------------


def test_pod_eviction_requeues_as_attempt_2_on_a_new_jobset(gke: Gke) -> None:
    gke.submit("spot", LOOP)
    daemon = gke.daemon()
    gke.drive(daemon, lambda: "line 5\n" in gke.log("spot"), "output of attempt 1")
    first = gke.runner_record("spot")["name"]
    (pod,) = gke.cluster.pods(jobset_name(first))
    evicted = time.monotonic()
    gke.cluster.evict(pod["metadata"]["name"])
    gke.drive(daemon, lambda: gke.info("spot").state.attempt == 2, "attempt 2")
    second = gke.runner_record("spot")["name"]
    gke.drive(daemon, lambda: jobset_name(second) in gke.cluster.jobsets(), "attempt 2's JobSet")
    print(f"eviction to the requeued attempt's JobSet: {time.monotonic() - evicted:.1f} s")
    assert second.endswith("-a2") and first.endswith("-a1")
    info = gke.info("spot")
    assert info.state.provider_preemptions == 1 and info.status != "FAILED"
    events = [e for e, _ in gke.history("spot")]
    assert "PROVIDER_PREEMPTED" in events
    (why,) = [r for e, r in gke.history("spot") if e == "PROVIDER_PREEMPTED"]
    assert "evicted" in why and "PreemptionByScheduler" in why
    log = gke.log("spot")
    exit_record = Store(str(gke.root)).agents.read("spot", first, 0, "exit")
    section = log.split("=== [bastion] attempt 1 of", 1)[1].split("\n", 1)[1]
    section = section.split("=== [bastion] attempt 1 ", 1)[0]
    assert len(section) == exit_record["output_bytes"]  # complete up to the eviction
    gke.drive(daemon, jobset_gone(gke, jobset_name(first)), "attempt 1's JobSet deleted")
    gke.client.cancel("spot", user_id="tester")
    gke.drive(daemon, lambda: gke.finished("spot"), "the cancel")


# -- 4. cancel deletes the JobSet -------------------------------------------------------------


def test_cancel_deletes_the_jobset_verified_by_listing(gke: Gke) -> None:
    gke.submit("long", "sleep 600")
    daemon = gke.daemon()
    gke.drive(daemon, lambda: gke.runner_record("long").get("phase") == "RUNNING", "running")
    name = jobset_name(gke.runner_record("long")["name"])
    assert name in gke.cluster.jobsets()
    gke.client.cancel("long", user_id="tester")
    gke.drive(daemon, lambda: gke.finished("long"), "the cancel")
    assert gke.info("long").status == "CANCELLED"
    assert name not in gke.cluster.jobsets() and not gke.cluster.pods(name)
    assert any(e == "DELETED" and f"JobSet {name}" in r for e, r in gke.history("long"))


# -- 5. a daemon killed between the create and its state write adopts ------------------------


def test_daemon_killed_after_create_adopts_without_a_second_jobset(gke: Gke) -> None:
    gke.submit("crash", 'echo "once on $BASTION_WORKER"')
    first = gke.daemon("work-1")
    runner = gke.runner(first)
    created, never = threading.Event(), threading.Event()
    real_start = runner.start

    def start_then_die(attempt: Attempt) -> Any:
        real_start(attempt)  # the JobSet is created ...
        created.set()
        never.wait(60)  # ... and the daemon dies before it takes in the handle
        raise SystemExit("killed")

    runner.start = start_then_die  # type: ignore[method-assign]
    first.cycle(time.time())
    assert created.wait(30)
    record = gke.runner_record("crash")
    assert record["name"] and record.get("handle") is None
    (uid,) = [js["metadata"]["uid"] for js in gke.cluster.jobsets().values()]
    second = gke.daemon("work-2")
    try:
        gke.drive(second, lambda: gke.finished("crash"), "crash to finish")
    finally:
        never.set()
    info = gke.info("crash")
    assert (info.status, info.state.attempt) == ("SUCCEEDED", 1)
    assert gke.cluster.seen == {jobset_name(record["name"])}  # one JobSet ever
    assert "once on 0\n" in gke.log("crash")
    assert uid  # the adopted JobSet was the first daemon's


def test_a_jobset_of_the_same_name_that_is_not_ours_is_not_adopted(gke: Gke) -> None:
    """A 409 on create is adoption only when the JobSet read back names this root and attempt;
    another root's JobSet under that name is a clash, reported and left alone."""
    runner = gke.runner(gke.daemon())
    mine = attempt_name(str(gke.root), "clash", "sub", 1, "run")
    foreign = {"bastion-root": "abcdef", "bastion-runner": "gke", "bastion-attempt-name": mine}
    gke.cluster.kueue = "hold"  # nothing of it runs (suspended)
    gke.cluster.create_jobset(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": jobset_name(mine), "labels": foreign},
            "spec": {"suspend": True, "replicatedJobs": []},
        }
    )
    options = {"kind": "gke", "instance_type": "tpu-v5p-8"}
    attempt = Attempt(
        name=mine, job="clash", attempt=1, command="echo never", env={}, options=options
    )
    with pytest.raises(RunnerError, match=r"already exists in namespace .* not this attempt's"):
        runner.start(attempt)
    assert gke.cluster.jobsets()[jobset_name(mine)]["metadata"]["labels"] == foreign


# -- 6. orphans -------------------------------------------------------------------------------


def test_orphan_jobset_of_this_root_is_deleted_others_left_alone(gke: Gke) -> None:
    daemon = gke.daemon()
    runner = gke.runner(daemon)
    mine = attempt_name(str(gke.root), "gone", "sub", 1, "run")

    def jobset(name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": name, "labels": labels},
            "spec": {"suspend": True, "replicatedJobs": []},
        }

    gke.cluster.kueue = "hold"  # nothing of these runs (suspended)
    gke.cluster.create_jobset(
        jobset(
            jobset_name(mine),
            {"bastion-root": runner.tag, "bastion-runner": "gke", "bastion-attempt-name": mine},
        )
    )
    other = attempt_name("gs://another/root", "theirs", "sub", 1, "run")
    gke.cluster.create_jobset(
        jobset(
            jobset_name(other),
            {"bastion-root": "abcdef", "bastion-runner": "gke", "bastion-attempt-name": other},
        )
    )
    gke.cluster.create_jobset(jobset("unlabelled", {}))
    # Same root, but a name that is not its attempt label's JobSet name: not ours either.
    gke.cluster.create_jobset(
        jobset(
            "bst-x-impostor",
            {"bastion-root": runner.tag, "bastion-runner": "gke", "bastion-attempt-name": mine},
        )
    )
    for _ in range(SWEEP_EVERY_CYCLES + 2):
        gke.step(daemon)
        if jobset_name(mine) not in gke.cluster.jobsets():
            break
    gke.drive(daemon, jobset_gone(gke, jobset_name(mine)), "the orphan to be deleted")
    for _ in range(3):
        gke.step(daemon)
    assert sorted(gke.cluster.jobsets()) == sorted(
        [jobset_name(other), "unlabelled", "bst-x-impostor"]
    )


# -- 7. Kueue keeps a JobSet suspended: QUEUED with its queue, then admitted ------------------


def test_kueue_suspension_shows_queued_with_the_queue_then_runs(gke: Gke) -> None:
    gke.cluster.kueue = "team-a"
    gke.submit("queued", "echo admitted")
    daemon = gke.daemon(queue="team-a")
    gke.drive(
        daemon, lambda: gke.info("queued").reason.find("suspended by Kueue") >= 0, "QUEUED by Kueue"
    )
    info = gke.info("queued")
    assert gke.runner_record("queued")["phase"] == "QUEUED"
    assert "suspended by Kueue in queue team-a" in info.reason
    name = jobset_name(gke.runner_record("queued")["name"])
    assert not gke.cluster.pods(name)
    gke.cluster.admit(name)
    gke.drive(daemon, lambda: gke.finished("queued"), "queued to finish")
    assert gke.info("queued").status == "SUCCEEDED" and "admitted\n" in gke.log("queued")


# -- 8. provisioning counts, pods that die before the agent runs -----------------------------


def test_unscheduled_pods_show_provisioning_with_counts(gke: Gke) -> None:
    gke.cluster.hold = True
    gke.submit("wait", "echo finally", resources={"v5p": 32}, instance_type="tpu-v5p-32")
    daemon = gke.daemon()
    gke.drive(daemon, lambda: "unschedulable" in gke.info("wait").reason, "PROVISIONING")
    assert gke.runner_record("wait")["phase"] == "PROVISIONING"
    assert "0 of 4 pods scheduled (unschedulable: 0/3 nodes are available" in (
        gke.info("wait").reason
    )
    gke.cluster.hold = False
    gke.drive(daemon, lambda: gke.finished("wait"), "wait to finish")
    assert gke.info("wait").status == "SUCCEEDED"


def test_image_pull_failure_before_the_agent_fails_with_the_pods_reason(gke: Gke) -> None:
    gke.cluster.hold = True
    gke.submit("pull", "echo never")
    daemon = gke.daemon()
    gke.drive(daemon, lambda: "pods scheduled" in gke.info("pull").reason, "PROVISIONING")
    (pod,) = gke.cluster.pods(jobset_name(gke.runner_record("pull")["name"]))
    gke.cluster.fail_image_pull(pod["metadata"]["name"])
    gke.drive(daemon, lambda: gke.finished("pull"), "pull to finish")
    info = gke.info("pull")
    assert info.status == "FAILED"
    assert "ImagePullBackOff" in info.reason and "nope:latest" in info.reason


# -- 9. errors a user can act on --------------------------------------------------------------


def test_forbidden_create_names_the_verb_and_resource(gke: Gke) -> None:
    gke.submit("rbac", "echo never")
    daemon = gke.daemon(kubeconfig=gke.kube.nobody_kubeconfig)
    gke.drive(daemon, lambda: gke.finished("rbac"), "rbac to finish")
    info = gke.info("rbac")
    assert info.status == "FAILED"
    assert "forbidden" in info.reason and '"nobody"' in info.reason
    assert "jobsets" in info.reason and "RBAC" in info.reason
    assert not gke.cluster.jobsets()


def test_missing_kubeconfig_is_one_clear_reason(gke: Gke) -> None:
    gke.submit("nocfg", "echo never")
    daemon = gke.daemon(kubeconfig=str(gke.tmp / "missing.kubeconfig"))
    gke.drive(daemon, lambda: gke.finished("nocfg"), "nocfg to finish")
    info = gke.info("nocfg")
    assert info.status == "FAILED" and "no kubeconfig at" in info.reason


def test_missing_jobset_crd_is_one_clear_reason(gke: Gke) -> None:
    gke.kube.remove_crd()
    try:
        gke.submit("nocrd", "echo never")
        daemon = gke.daemon()
        gke.drive(daemon, lambda: gke.finished("nocrd"), "nocrd to finish")
        info = gke.info("nocrd")
        assert info.status == "FAILED"
        assert "JobSet CRD (jobsets.jobset.x-k8s.io/v1alpha2) is not installed" in info.reason
    finally:
        gke.kube.install_crd()


# -- 10. AXLearn's launch line with --runner=gke ---------------------------------------------


def test_launch_with_instance_type_and_runner_gke_writes_a_gke_spec(tmp_path: Path) -> None:
    import json
    import subprocess

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "launch.cli",
            "launch",
            f"--root={tmp_path / 'root'}",
            "--dry_run",
            "--name=train",
            "--instance_type=tpu-v5p-128",
            "--num_replicas=2",
            "--runner=gke",
            "--bundler=none",
            "--",
            "python3",
            "train.py",
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads(done.stdout)
    assert spec["runner"] == {"kind": "gke", "instance_type": "tpu-v5p-128", "num_replicas": 2}
    assert spec["metadata"]["resources"] == {"v5p": 256}


# -- cost: API calls per steady-state cycle ---------------------------------------------------


def test_a_steady_cycle_costs_one_jobset_list_and_one_pod_list_whatever_the_jobs(
    gke: Gke,
) -> None:
    for i in range(3):
        gke.submit(f"steady{i}", "sleep 120")
    daemon = gke.daemon()
    runner = gke.runner(daemon)
    marked = time.monotonic()
    gke.drive(
        daemon,
        lambda: all(gke.runner_record(f"steady{i}").get("phase") == "RUNNING" for i in range(3)),
        "every job running",
    )
    print(f"3 jobs submitted to all RUNNING: {time.monotonic() - marked:.1f} s")
    counts = []
    for _ in range(3):
        before = runner.calls
        gke.step(daemon)
        counts.append(runner.calls - before)
    print(f"API calls per steady cycle with 3 running gke jobs: {counts}")
    assert all(c <= 2 for c in counts), counts  # the JobSet listing and the pod listing
    for i in range(3):
        gke.client.cancel(f"steady{i}", user_id="tester")
    gke.drive(daemon, lambda: all(gke.finished(f"steady{i}") for i in range(3)), "cancels")


# -- the runner contract (tests/runner_contract.py) on gke ------------------------------------


class TestGkeContract(RunnerContract):
    """The contract every runner passes, here against the real apiserver: the runner is used
    without a daemon (no cycles), so every look lists afresh and delete waits for the garbage
    collector (a second or less) before it says gone."""

    __test__ = True
    kind = "gke"
    timeout = 60.0

    @pytest.fixture(autouse=True)
    def _cluster(self, _contract_context, kube: KubeServer, cluster: Cluster, tmp_path: Path):
        self.kube, self.cluster = kube, cluster
        self.root = str(tmp_path / f"root-{uuid.uuid4().hex[:8]}")  # a local root per test

    def make_runner(self, tmp_path):
        settings = {
            "root": self.root,
            "kubeconfig": self.kube.kubeconfig,
            "image": "x",
            "instance_type": "tpu-v5p-8",
            "python": sys.executable,
            "publish_package": False,
            "agent_args": FAST,
            "listing_ttl": 0,
            "termination_grace_seconds": 5,
        }
        return GkeRunner(settings)


# -- 11. a refusal of the manifest itself: one clear reason, no retry loop --------------------


def test_a_manifest_the_apiserver_refuses_as_invalid_fails_once_with_its_words(
    gke: Gke,
) -> None:
    """A cluster policy in the CRD's schema (replicas at most 4) and a job asking for 5
    slices: the real apiserver answers 422 Invalid; the job fails at attempt 1 with the
    apiserver's message and a fix, and no JobSet is made or retried."""
    with gke.kube.replicas_at_most(4):
        gke.submit("toobig", "echo never", resources={"v5p": 40}, num_replicas=5)
        daemon = gke.daemon()
        gke.drive(daemon, lambda: gke.finished("toobig"), "toobig to finish")
    info = gke.info("toobig")
    assert (info.status, info.state.attempt) == ("FAILED", 1)
    assert "the cluster's validation refused to create JobSet" in info.reason, info.reason
    assert "(422)" in info.reason and "less than or equal to 4" in info.reason, info.reason
    assert "change the job's options" in info.reason
    assert not gke.cluster.jobsets()
    assert not [e for e, _ in gke.history("toobig") if e == "REQUEUED"]


def test_an_admission_webhook_denial_reads_as_the_webhooks_refusal_not_rbac() -> None:
    """What a validating webhook's denial looks like on the wire (403 with the webhook's
    message, as kube-apiserver writes it): the reason names the webhook, not RBAC."""
    from kubernetes.client import ApiException

    denial = ApiException(status=403, reason="Forbidden")
    denial.body = json.dumps(
        {
            "kind": "Status",
            "status": "Failure",
            "message": 'admission webhook "jobset.policy.example.com" denied the request: '
            "TPU v5p jobs need a reservation",
            "reason": "Forbidden",
            "code": 403,
        }
    )
    error = refusal(denial, "create", "JobSet js-1 in namespace default")
    assert isinstance(error, RunnerError)
    assert str(error).startswith("an admission webhook refused to create JobSet js-1")
    assert "TPU v5p jobs need a reservation" in str(error) and "RBAC" not in str(error)


# -- 12. AXLearn instance-type specs run on gke when the settings say so ----------------------


def test_instance_type_specs_that_name_no_gke_runner_run_on_gke_when_settings_say_so(
    gke: Gke,
) -> None:
    """``[runners.gke] instance_types = true``: specs whose runner an instance type implied
    (``bastion launch --instance_type`` without ``--runner``: tpu-* as tpu, gpu-* as gce) run
    as JobSets, unchanged."""
    from launch.bundling import instance_type_runner

    for name, instance_type, command in (
        ("axtpu", "tpu-v5p-8", 'echo "tpu $BASTION_WORKER"'),
        ("axgpu", "gpu-a3-highgpu-8g", 'echo "gpu $BASTION_WORKER"'),
    ):
        runner, resources = instance_type_runner(instance_type)
        assert runner["kind"] in ("tpu", "gce")  # what the spec names: not gke
        gke.client.submit(
            new_jobspec(
                name=name,
                command=command,
                user_id="tester",
                project_id="default",
                resources=resources,
                runner=runner,
            )
        )
    daemon = gke.daemon(instance_types=True)
    gke.drive(daemon, lambda: gke.finished("axtpu") and gke.finished("axgpu"), "both to finish")
    assert gke.info("axtpu").status == "SUCCEEDED" and "tpu 0\n" in gke.log("axtpu")
    assert gke.info("axgpu").status == "SUCCEEDED" and "gpu 0\n" in gke.log("axgpu")
    (tpu,) = gke.attempts("axtpu")
    body = gke.cluster.stored[jobset_name(tpu)]
    pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5p-slice"
    (gpu,) = gke.attempts("axgpu")
    body = gke.cluster.stored[jobset_name(gpu)]
    pod = body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "a3-highgpu-8g"
    placed = [r for e, r in gke.history("axgpu") if e == "PLACED"]
    assert placed and "JobSet" in placed[0], placed


def test_instance_types_must_be_true_or_false_and_claimed_by_one_runner(tmp_path: Path) -> None:
    from bastion.daemon.start import SettingsError, load_settings

    bad = tmp_path / "bad.toml"
    bad.write_text('[runners.gke]\ninstance_types = "yes"\n')
    with pytest.raises(SettingsError, match=r"bad.toml: \[runners.gke\] instance_types = 'yes'"):
        load_settings(str(bad))
    two = tmp_path / "two.toml"
    two.write_text("[runners.gke]\ninstance_types = true\n[runners.slurm]\ninstance_types = true\n")
    with pytest.raises(SettingsError, match=r"one runner takes the instance-type jobs"):
        load_settings(str(two))
