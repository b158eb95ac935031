"""A real kube-apiserver (1.20.2, built from Debian's source by ``scripts/kube_setup.sh``) with
etcd and the garbage collector of kube-controller-manager, on 127.0.0.1 free ports, for the
gke runner's tests; and :class:`Cluster`, which plays the parts that cannot run here.

The session fixture ``kube`` runs the setup script (cached: about a second once built; a cold
build takes minutes), then starts etcd, the apiserver (RBAC, a static bearer token for an
admin in ``system:masters`` and one for a user with no rights) and the controller-manager
(``--controllers=garbagecollector``: Foreground deletion completes), installs a minimal
structural JobSet CRD (the generated one does not load on 1.20: engines.md 3.3) and stops
them all at the end. A build or start that fails fails the tests loudly: they are never
skipped.

No JobSet controller, scheduler or kubelet can run here. :class:`Cluster` plays them through
the real API, in a thread: for each JobSet it creates the pods the JobSet implies (named and
annotated as the JobSet and Job controllers name them, owned by the JobSet so the garbage
collector removes them), marks them scheduled and Running, and runs each pod's container
command as a local process with the downward-API variables resolved from the pod's own
annotations, so the real agent writes to the real bucket; when a process exits it writes the
pod's terminated state and the JobSet's ``Completed``/``Failed`` condition; when a pod is
deleted it SIGTERMs the process (the kubelet's part). Tests can hold pods unscheduled, suspend
a JobSet as Kueue does and admit it, evict a pod (``DisruptionTarget``), and fail a pod
before its container starts (image pull).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "kube_setup.sh"
SETUP_TIMEOUT = 1800
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"

CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": PLURAL,
            "singular": "jobset",
            "kind": "JobSet",
            "listKind": "JobSetList",
        },
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class KubeServer:
    """A running apiserver: its URL, tokens, and kubeconfig files for each user."""

    url: str
    admin_token: str
    nobody_token: str
    kubeconfig: str  # admin
    nobody_kubeconfig: str  # authenticated, no RBAC rights
    build_seconds: float
    start_seconds: float

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    def install_crd(self) -> None:
        from kubernetes import client

        api = client.ApiextensionsV1Api(self.api_client())
        with contextlib.suppress(client.ApiException):
            api.create_custom_resource_definition(CRD)
        custom = client.CustomObjectsApi(self.api_client())
        deadline = time.monotonic() + 30
        while True:
            try:
                custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
                return
            except client.ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    @contextlib.contextmanager
    def replicas_at_most(self, maximum: int) -> Iterator[None]:
        """The JobSet CRD's schema says ``replicas <= maximum`` (a cluster policy the
        apiserver itself enforces): a create that asks for more gets a real 422 Invalid.
        The plain CRD is back afterwards."""
        from kubernetes import client

        api = client.ApiextensionsV1Api(self.api_client())
        strict = json.loads(json.dumps(CRD))
        spec = strict["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        spec["properties"] = {
            "replicatedJobs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"replicas": {"type": "integer", "maximum": maximum}},
                },
            }
        }
        self._replace_crd(api, strict)
        probe = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "JobSet",
            "metadata": {"name": "schema-probe"},
            "spec": {"replicatedJobs": [{"name": "job", "replicas": maximum + 1}]},
        }
        custom = client.CustomObjectsApi(self.api_client())
        deadline = time.monotonic() + 30
        while True:  # the apiserver takes the new schema in within a second or two
            try:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, "default", PLURAL, probe, dry_run="All"
                )
            except client.ApiException as e:
                if e.status == 422:
                    break
            if time.monotonic() > deadline:
                raise AssertionError("the stricter JobSet schema was not enforced in 30 s")
            time.sleep(0.2)
        try:
            yield
        finally:
            self._replace_crd(api, CRD)

    @staticmethod
    def _replace_crd(api: Any, body: dict) -> None:
        current = api.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        body = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": current.metadata.resource_version},
        }
        api.replace_custom_resource_definition(f"{PLURAL}.{GROUP}", body)

    def remove_crd(self) -> None:
        from kubernetes import client

        api = client.ApiextensionsV1Api(self.api_client())
        api.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
        custom = client.CustomObjectsApi(self.api_client())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
            except client.ApiException as e:
                if e.status == 404:
                    return
            time.sleep(0.2)
        raise AssertionError("the JobSet CRD did not go away")


def _kubeconfig(path: Path, url: str, token: str, ca: Path) -> str:
    """A kubeconfig as GKE's get-credentials writes one: server, CA, a user with a token."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: test\n  cluster:\n    server: {url}\n"
        f"    certificate-authority: {ca}\n"
        f"users:\n- name: u\n  user:\n    token: {token}\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: u\n"
        "current-context: test\n"
    )
    return str(path)


def _wait(what: str, ok: Any, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log.exists() else ""
            pytest.fail(f"{what} did not come up (exit {proc.poll()}):\n{tail}", pytrace=False)
        time.sleep(0.1)


def _healthy(url: str, token: str | None = None) -> bool:
    import ssl
    import urllib.request

    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(
            request, timeout=2, context=ssl._create_unverified_context()
        ) as answer:
            return answer.status == 200
    except Exception:
        return False


@contextlib.contextmanager
def kube_server() -> Any:
    """Build (cached) and start etcd, kube-apiserver and the garbage collector; stop them."""
    began = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", str(SETUP)], capture_output=True, text=True, timeout=SETUP_TIMEOUT
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{SETUP} took more than {SETUP_TIMEOUT} s:\n{e.stderr or ''}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"{SETUP} failed (exit {done.returncode}): the gke tests need a real "
            f"kube-apiserver.\n{done.stdout}\n{done.stderr}",
            pytrace=False,
        )
    build_seconds = time.monotonic() - began
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in done.stdout.splitlines()
        if line.startswith("export ")
    )
    work = Path(tempfile.mkdtemp(prefix="bastion-kube-"))
    procs: list[subprocess.Popen] = []
    logs: list[Any] = []

    def spawn(name: str, argv: list[str]) -> tuple[subprocess.Popen, Path]:
        log = work / f"{name}.log"
        out = open(log, "wb")  # noqa: SIM115 (closed at the end)
        logs.append(out)
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(proc)
        return proc, log

    try:
        started = time.monotonic()
        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        etcd, etcd_log = spawn(
            "etcd",
            [
                exports["BASTION_ETCD"],
                "--data-dir",
                str(work / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer_port}",
                "--log-level",
                "warn",
            ],
        )
        _wait("etcd", lambda: _healthy(f"{etcd_url}/health"), etcd, etcd_log)
        key = work / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        admin, nobody = secrets.token_hex(16), secrets.token_hex(16)
        (work / "tokens.csv").write_text(
            f'{admin},admin,admin-uid,"system:masters"\n{nobody},nobody,nobody-uid\n'
        )
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        apiserver, api_log = spawn(
            "kube-apiserver",
            [
                exports["BASTION_KUBE_APISERVER"],
                f"--etcd-servers={etcd_url}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--cert-dir={work / 'certs'}",
                "--authorization-mode=RBAC",
                f"--token-auth-file={work / 'tokens.csv'}",
                "--service-account-issuer=https://bastion.test",
                f"--service-account-key-file={key}",
                f"--service-account-signing-key-file={key}",
                "--service-cluster-ip-range=10.255.0.0/24",
                "--disable-admission-plugins=ServiceAccount",
                "--logtostderr",
                "-v=0",
            ],
        )
        _wait("kube-apiserver", lambda: _healthy(f"{url}/readyz", admin), apiserver, api_log)
        ca = work / "certs" / "apiserver.crt"  # self-signed, for 127.0.0.1 and localhost
        kubeconfig = _kubeconfig(work / "admin.kubeconfig", url, admin, ca)
        server = KubeServer(
            url,
            admin,
            nobody,
            kubeconfig,
            _kubeconfig(work / "nobody.kubeconfig", url, nobody, ca),
            build_seconds,
            0.0,
        )
        server.install_crd()
        spawn(
            "kube-controller-manager",
            [
                exports["BASTION_KUBE_CONTROLLER_MANAGER"],
                f"--kubeconfig={kubeconfig}",
                "--controllers=garbagecollector",
                "--leader-elect=false",
                "--port=0",
                "--secure-port=0",
                "--concurrent-gc-syncs=5",
                "--logtostderr",
            ],
        )
        server.start_seconds = time.monotonic() - started
        yield server
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for out in logs:
            out.close()


# -- the controllers and kubelet this machine does not have ----------------------------------


class Cluster:
    """Plays the JobSet controller, the scheduler and the kubelet against the real API."""

    def __init__(
        self,
        server: KubeServer,
        tmp: Path,
        namespace: str = "default",
        spawn: Callable[[dict, dict[str, str]], Any] | None = None,
    ) -> None:
        """``spawn(pod, env)``: what runs a pod's container, a ``Popen`` or an object with
        its ``poll``, ``returncode``, ``send_signal``, ``kill`` and ``wait`` (the benchmark's
        simulated agents, so 200 pods need no 200 processes); default the real process."""
        from kubernetes import client

        self.server, self.tmp, self.namespace = server, tmp, namespace
        self.spawn = spawn
        self.api = server.api_client()
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.tag = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen] = {}  # pod name -> its container's process
        self.exit_codes: dict[str, int] = {}
        self.hold = False  # pods of new JobSets stay unscheduled
        self.kueue: str | None = None  # new JobSets with this queue label are suspended
        self.seen: set[str] = set()  # every JobSet name ever seen
        self.attempts: dict[str, str] = {}  # JobSet name -> its attempt label
        self.stored: dict[str, dict] = {}  # JobSet name -> the object as the apiserver stored it
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="kube-cluster")
        self._thread.start()

    # -- what tests read -------------------------------------------------------------------
    def jobsets(self) -> dict[str, dict]:
        found = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        return {js["metadata"]["name"]: js for js in found["items"]}

    def pods(self, jobset: str | None = None) -> list[dict]:
        found = self.api.sanitize_for_serialization(
            self.core.list_namespaced_pod(
                self.namespace,
                label_selector=f"jobset.sigs.k8s.io/jobset-name={jobset}" if jobset else None,
            )
        )
        return found["items"]

    # -- what tests do ---------------------------------------------------------------------
    def create_jobset(self, body: dict) -> dict:
        return self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )

    def admit(self, name: str) -> None:
        """Kueue admits the workload: ``spec.suspend`` false, Suspended condition False."""
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"suspend": False}}
        )
        self._set_condition(name, "Suspended", "False", "ResumeJobs", "jobset is resumed")

    def evict(
        self, pod: str, reason: str = "PreemptionByScheduler", message: str = "spot node reclaimed"
    ) -> None:
        """A spot node going away: the pod gets DisruptionTarget, then fails, its process
        gets SIGTERM (the agent flushes) and the JobSet fails (maxRestarts 0)."""
        now = _now()
        body = {
            "status": {
                "phase": "Failed",
                "reason": "Terminated",
                "message": message,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    },
                ],
            }
        }
        with self._lock:
            self.exit_codes[pod] = 143
            proc = self.procs.get(pod)
        self.core.patch_namespaced_pod_status(pod, self.namespace, body)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def fail_image_pull(self, pod: str) -> None:
        """The container never starts (the agent never runs): only the pod can say why."""
        with self._lock:
            proc = self.procs.pop(pod, None)
            self.exit_codes[pod] = -1
        if proc is not None and proc.poll() is None:
            proc.kill()
        body = {
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": False,
                        "restartCount": 0,
                        "image": "x",
                        "imageID": "",
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "nope:latest"',
                            }
                        },
                    }
                ],
            }
        }
        self.core.patch_namespaced_pod_status(pod, self.namespace, body)

    # -- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as e:  # an apiserver hiccup: next round
                print(f"kube_cluster: {type(e).__name__}: {e}", file=sys.stderr)
            self._stop.wait(0.2)

    def _step(self) -> None:
        jobsets = self.jobsets()
        pods = self.pods()
        by_js: dict[str, list[dict]] = {}
        for pod in pods:
            js = (pod["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name")
            by_js.setdefault(js or "", []).append(pod)
        live = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
        with self._lock:
            gone = [(n, p) for n, p in self.procs.items() if n not in live]
        for _name, proc in gone:  # the kubelet: a deleted pod's container gets SIGTERM
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, js in jobsets.items():
            if js["metadata"].get("deletionTimestamp"):
                continue
            labels = js["metadata"].get("labels") or {}
            if name not in self.seen:
                self.seen.add(name)
                self.attempts[name] = labels.get("bastion-attempt-name", "")
                self.stored[name] = js
                if self.kueue is not None and labels.get("kueue.x-k8s.io/queue-name"):
                    self.custom.patch_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, name, {"spec": {"suspend": True}}
                    )
                    self._set_condition(
                        name, "Suspended", "True", "SuspendedJobs", "jobset is suspended"
                    )
                    continue
            if js.get("spec", {}).get("suspend"):
                continue
            if _true(js, "Completed") or _true(js, "Failed"):
                continue
            mine = by_js.get(name, [])
            if not mine:
                self._create_pods(js)
                continue
            for pod in mine:
                self._kubelet(pod)
            self._controller(js, by_js.get(name, []))

    def _create_pods(self, js: dict) -> None:
        name = js["metadata"]["name"]
        for rjob in js["spec"]["replicatedJobs"]:
            spec = rjob["template"]["spec"]
            template = spec["template"]
            for j in range(int(rjob.get("replicas", 1))):
                for i in range(int(spec.get("parallelism", 1))):
                    meta = template.get("metadata") or {}
                    js_labels = {
                        "jobset.sigs.k8s.io/jobset-name": name,
                        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                        "jobset.sigs.k8s.io/job-index": str(j),
                    }
                    annotations = {
                        **(meta.get("annotations") or {}),
                        **js_labels,
                        "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob.get("replicas", 1)),
                        "batch.kubernetes.io/job-completion-index": str(i),
                    }
                    body = {
                        "metadata": {
                            "name": f"{name}-{rjob['name']}-{j}-{i}-{secrets.token_hex(3)[:5]}",
                            "labels": {**(meta.get("labels") or {}), **js_labels},
                            "annotations": annotations,
                            "ownerReferences": [
                                {
                                    "apiVersion": f"{GROUP}/{VERSION}",
                                    "kind": "JobSet",
                                    "name": name,
                                    "uid": js["metadata"]["uid"],
                                    "controller": True,
                                    "blockOwnerDeletion": True,
                                }
                            ],
                        },
                        "spec": template["spec"],
                    }
                    self.core.create_namespaced_pod(self.namespace, body)

    def _kubelet(self, pod: dict) -> None:
        """Schedule and run a pending pod (unless held); report a finished process."""
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        if pod["metadata"].get("deletionTimestamp") or status.get("phase") in (
            "Succeeded",
            "Failed",
        ):
            return
        with self._lock:
            proc, code = self.procs.get(name), self.exit_codes.get(name)
        if code == -1:  # failed before its container started
            return
        if proc is None:
            if self.hold:
                self.core.patch_namespaced_pod_status(
                    name,
                    self.namespace,
                    {
                        "status": {
                            "phase": "Pending",
                            "conditions": [
                                {
                                    "type": "PodScheduled",
                                    "status": "False",
                                    "reason": "Unschedulable",
                                    "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",  # noqa: E501
                                    "lastTransitionTime": _now(),
                                }
                            ],
                        }
                    },
                )
                return
            self._run(pod)
            self.core.patch_namespaced_pod_status(
                name,
                self.namespace,
                {
                    "status": {
                        "phase": "Running",
                        "startTime": _now(),
                        "conditions": [
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}
                        ],
                        "containerStatuses": [
                            {
                                "name": "main",
                                "ready": True,
                                "restartCount": 0,
                                "image": "x",
                                "imageID": "",
                                "started": True,
                                "state": {"running": {"startedAt": _now()}},
                            }
                        ],
                    }
                },
            )
            return
        if proc.poll() is None:
            return
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        with self._lock:
            self.exit_codes.setdefault(name, code)
        self.core.patch_namespaced_pod_status(
            name,
            self.namespace,
            {
                "status": {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [
                        {
                            "name": "main",
                            "ready": False,
                            "restartCount": 0,
                            "image": "x",
                            "imageID": "",
                            "state": {
                                "terminated": {
                                    "exitCode": code,
                                    "reason": "Completed" if code == 0 else "Error",
                                }
                            },
                        }
                    ],
                }
            },
        )

    def _run(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        annotations = pod["metadata"].get("annotations") or {}
        env = dict(os.environ, KUBE_TEST_TAG=self.tag, PYTHONPATH=str(REPO))
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = item["value"]
            else:  # downward API: metadata.annotations['key']
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                key = path.split("['", 1)[1].rstrip("']")
                env[item["name"]] = annotations.get(key, "")
        if self.spawn is not None:
            with self._lock:
                self.procs[name] = self.spawn(pod, env)
            return
        out = open(self.tmp / f"{name}.out", "wb")  # noqa: SIM115 (closed by the child)
        proc = subprocess.Popen(
            container["command"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        with self._lock:
            self.procs[name] = proc

    def _controller(self, js: dict, pods: list[dict]) -> None:
        """JobSet status from its pods: Failed on any failed pod (maxRestarts 0), Completed
        once every pod succeeded."""
        name = js["metadata"]["name"]
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        if any(phase == "Failed" for phase in phases):
            self._set_condition(
                name,
                "Failed",
                "True",
                "FailedJobs",
                "jobset failed due to one or more job failures",
            )
        elif phases and all(phase == "Succeeded" for phase in phases):
            self._set_condition(
                name, "Completed", "True", "AllJobsCompleted", "jobset completed successfully"
            )

    def _set_condition(self, name: str, kind: str, status: str, reason: str, message: str) -> None:
        js = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        conditions = [
            c for c in (js.get("status") or {}).get("conditions") or [] if c.get("type") != kind
        ]
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": _now(),
            }
        )
        status_body: dict[str, Any] = {"conditions": conditions}
        if kind in ("Completed", "Failed") and status == "True":
            status_body["terminalState"] = kind
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, name, {"status": status_body}
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        from tests.harness import kill_all, processes_with_env

        kill_all(processes_with_env("KUBE_TEST_TAG", self.tag))
        # Leave the namespace empty for the next test (background: no GC wait).
        for name in self.jobsets():
            with contextlib.suppress(Exception):
                self.custom.delete_namespaced_custom_object(
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    name,
                    grace_period_seconds=0,
                    propagation_policy="Background",
                )
        with contextlib.suppress(Exception):
            self.core.delete_collection_namespaced_pod(self.namespace, grace_period_seconds=0)


def _true(js: dict, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (js.get("status") or {}).get("conditions") or []
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@pytest.fixture(scope="session")
def kube() -> Any:
    with kube_server() as server:
        yield server


@pytest.fixture
def cluster(kube: KubeServer, tmp_path: Path) -> Any:
    c = Cluster(kube, tmp_path)
    yield c
    c.close()
