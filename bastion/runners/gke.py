"""The GKE runner (kind ``gke``): one JobSet (``jobset.x-k8s.io/v1alpha2``) per attempt, through
the official ``kubernetes`` Python client, the path AXLearn's own bastion takes on GKE.

Every pod's container command is the Bastion agent (the startup script of
:mod:`bastion.runners.startup`, as on TPU and GCE VMs): it fetches the bundle, runs the user's
command with the usual ``BASTION_*`` variables, and writes output chunks and exit records to the
bucket, where :class:`bastion.runners.kit.records.RemoteRecords` reads them. The worker's index is
``slice * hosts + host``: the host from the Indexed Job's completion index and the slice from
JobSet's ``job-index``, both mapped into the container from the pod's annotations (downward
API), so one command serves every pod.

Settings (``[runners.gke]``):

- ``root``: the daemon's root (set by the daemon); ``image`` (required, or per-job option
  ``image``): an image with bastion installed (the Dockerfile's worker target), or any Python
  image when ``package_url``/the published wheel can be installed in it (see startup.py).
- Where the cluster is: ``in_cluster = true`` (the daemon runs in a pod: its service account),
  else a kubeconfig: ``kubeconfig`` (default ``$KUBECONFIG``, then ``~/.kube/config``) and
  ``context`` (default: the file's current context).
- ``namespace`` (default ``default``), ``service_account``, ``priority_class``, ``queue`` (a
  Kueue LocalQueue: the label ``kueue.x-k8s.io/queue-name``, which current Kueue reads; the
  annotation AXLearn still writes is ignored by it), ``termination_grace_seconds`` (60).
- ``tiers``: capacity per quota tier, as the cloud runners' (``{0 = "reservation:r1", 1 =
  "spot"}``): spot is the node selector ``cloud.google.com/gke-spot`` plus its toleration, a
  reservation the selector ``cloud.google.com/reservation-name``. A job's ``spot`` or
  ``reservation`` option wins; ``spot`` (default false) is the default.
- ``python`` (``python3``), ``package_url``/``publish_package``, ``agent_args``,
  ``heartbeat_timeout`` (120), ``flush_seconds`` (45), ``listing_ttl`` (1, without a daemon).

Per-job options (``instance_type``, ``num_replicas`` and ``topology`` also as settings: the
defaults for specs that name none): ``instance_type`` (AXLearn's ``tpu-v5p-128`` or
``gpu-a3-highgpu-8g``) or ``accelerator_type``/``machine_type``, ``num_replicas`` (TPU
slices; GPU hosts), ``topology`` (TPU, else derived from the type), ``image``, ``queue``,
``spot``, ``reservation``.

The JobSet (AXLearn's shape where it matters, ../shared/reference/engines.md 1.2): one
replicated job ``job`` with ``replicas`` = slices and ``parallelism = completions`` = hosts per
slice (GPU: one replica of ``num_replicas`` hosts), ``backoffLimit: 0``, and
``failurePolicy.maxRestarts: 0``: one attempt is one JobSet, and a preemption is a requeue as a
new attempt (Bastion owns retries, so every preemption is seen and counted). TPU pods select
``cloud.google.com/gke-tpu-accelerator``/``gke-tpu-topology`` and ask for ``google.com/tpu``
chips per host; GPU pods select the machine type and ask for ``nvidia.com/gpu``.

Names: the JobSet is named after the attempt, shortened (the job's slug first) to at most
:data:`MAX_JOBSET_NAME` characters, since the JobSet webhook rejects a JobSet whose longest pod
name ``<js>-job-<slice>-<host>-xxxxx`` exceeds 63. It is labelled ``bastion-root``,
``bastion-runner: gke`` and ``bastion-attempt-name`` (the full attempt name): ownership is
decided by those labels, never by a name alone; the pod template carries them too.

Cost per cycle: one label-selected list of this root's JobSets for every poll, start and delete
(:meth:`GkeRunner.begin_cycle`), and one list of their pods only when an attempt needs pod
detail (not suspended, not finished); one listing of the agents' records. Nothing grows with
the number of jobs but the size of the answers.

Poll: JobSet absent (after create) → the agents' word, else LOST; being deleted → likewise;
``spec.suspend`` / ``Suspended`` → QUEUED ("suspended by Kueue in queue Q"), or PREEMPTED
once its agents had started (Kueue evicted it); a pod with a ``DisruptionTarget`` condition
or evicted/terminated by its node → PREEMPTED (after the agents' last flush); ``Failed`` →
the agents' exit code, else FAILED with the condition's reason and any pod's own (image pull,
bad command); ``Completed`` → the agents' records (SUCCEEDED once every exit record is in);
otherwise the agents' records, or PROVISIONING "k of N pods scheduled".

Stop: ``DELETE`` with ``propagationPolicy=Foreground`` and the grace period (the pods' agents
get SIGTERM and flush); at the deadline the remaining pods are deleted with grace 0. Delete is
verified by a later listing (a Foreground-deleting JobSet stays listed, with a
``deletionTimestamp``, until the garbage collector removed its pods).

Errors a user can act on become one clear :class:`RunnerError` on the job, not a retry loop:
no kubeconfig/context, 401, 403 (RBAC: which verb on which resource), 404 (the JobSet CRD not
installed, or the namespace missing), 400/422 (an admission webhook's or validation's refusal,
the apiserver's message). 409 on create is adoption once the labels say the JobSet is ours.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from bastion.bucket.runs import parse_run_name, run_name
from bastion.bucket.store import ObjectInfo, Store
from bastion.runners import startup
from bastion.runners.base import (
    Attempt,
    AttemptPhase,
    Handle,
    Observation,
    Owned,
    Runner,
    RunnerError,
    TryAgain,
    root_tag,
)
from bastion.runners.kit.lease_fence import check_term
from bastion.runners.kit.records import RemoteRecords
from bastion.runners.kit.retry import read_back

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
RJOB = "job"  # the replicated job's name (AXLearn's)
# The longest pod name is <js>-job-<slice>-<host>-xxxxx; up to 4-digit indexes: 20 characters.
MAX_JOBSET_NAME = 63 - len(f"-{RJOB}-9999-9999-xxxxx")
ROOT_LABEL, RUNNER_LABEL, ATTEMPT_LABEL = "bastion-root", "bastion-runner", "bastion-attempt-name"
JOB_ANNOTATION = "bastion-job-name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKER_ENV = "BASTION_GKE_WORKER_INDEX"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LISTING_TTL = 1.0
RETRYABLE_STATUS = frozenset({0, 408, 429, 500, 502, 503, 504})
# A container that cannot start: the agent never ran, so only the pod says why.
FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)
DISRUPTED_REASONS = frozenset(
    {"Evicted", "Terminated", "NodeShutdown", "Preempting", "NodeLost", "DeletionByTaintManager"}
)

_TPU = re.compile(r"(v4|v5p|v5litepod|v6e)-(\d+)")
_TPU_ACCELERATOR = {
    "v4": "tpu-v4-podslice",
    "v5p": "tpu-v5p-slice",
    "v5litepod": "tpu-v5-lite-podslice",
    "v6e": "tpu-v6e-slice",
}
_GPU_ACCELERATOR = {
    "a3-highgpu": "nvidia-h100-80gb",
    "a3-megagpu": "nvidia-h100-mega-80gb",
    "a3-ultragpu": "nvidia-h200-141gb",
    "a4-highgpu": "nvidia-b200",
    "a2-highgpu": "nvidia-tesla-a100",
    "a2-ultragpu": "nvidia-a100-80gb",
    "g2-standard": "nvidia-l4",
}


def from_settings(settings: Mapping[str, Any]) -> GkeRunner:
    return GkeRunner(settings)


# -- names and shapes (pure) -------------------------------------------------------------------

_ATTEMPT = re.compile(r"(bst-[0-9a-f]{6}-)(.*?)(-[0-9a-f]{8}-a\d+c?)")


def jobset_name(attempt: str) -> str:
    """The JobSet's name for an attempt: the attempt name when it fits
    :data:`MAX_JOBSET_NAME`, else the same with the job's slug cut (the root tag, the hash of
    job and submission, and the attempt number are kept, so it stays unique and deterministic)."""
    if len(attempt) <= MAX_JOBSET_NAME:
        return attempt
    m = _ATTEMPT.fullmatch(attempt)
    if not m:
        import hashlib

        return "bst-" + hashlib.sha1(attempt.encode()).hexdigest()[:16]
    head, slug, tail = m.groups()
    room = MAX_JOBSET_NAME - len(head) - len(tail) - 1
    slug = slug[:room].rstrip("-") if room > 0 else ""
    return f"{head}{slug}-{tail[1:]}" if slug else f"{head}{tail[1:]}"


def topology(family: str, chips: int) -> str:
    """GKE's ``gke-tpu-topology`` for a slice: 3D for v4/v5p (2x2x1, 2x2x2, 2x2x4, 2x4x4,
    4x4x4, ...), 2D for v5e/v6e (1x1, 2x2, 2x4, 4x4, 4x8, ...): the smallest dimension
    doubles until the chips are covered."""
    dims = [2, 2, 1] if family in ("v4", "v5p") and chips >= 4 else [1, 1]
    while dims[0] * dims[1] * (dims[2] if len(dims) == 3 else 1) < chips:
        low = min(dims)
        i = max(k for k, d in enumerate(dims) if d == low)
        dims[i] *= 2
    return "x".join(str(d) for d in dims)


def shape(options: Mapping[str, Any]) -> dict[str, Any]:
    """What the job's options ask for: ``{"tpu": (family, cores)}`` or ``{"gpu": (machine,
    count)}``, ``slices``, ``hosts`` per slice, and the node selector and limits per pod."""
    replicas = int(options.get("num_replicas") or 1)
    if replicas < 1:
        raise RunnerError(f"options num_replicas={replicas}: must be at least 1")
    text = str(
        options.get("accelerator_type")
        or options.get("machine_type")
        or options.get("instance_type")
        or ""
    )
    tpu = _TPU.fullmatch(text.removeprefix("tpu-"))
    if tpu:
        family, cores = tpu.group(1), int(tpu.group(2))
        chips = cores if family in ("v5litepod", "v6e") else max(1, cores // 2)
        hosts = (
            (1 if chips <= 8 else chips // 4)
            if family in ("v5litepod", "v6e")
            else max(1, cores // 8)
        )
        topo = str(options.get("topology") or topology(family, chips))
        return {
            "slices": replicas,
            "hosts": hosts,
            "tpu": True,
            "what": f"{_TPU_ACCELERATOR[family]} {topo}",
            "selector": {
                "cloud.google.com/gke-tpu-accelerator": _TPU_ACCELERATOR[family],
                "cloud.google.com/gke-tpu-topology": topo,
            },
            "limits": {"google.com/tpu": str(chips // hosts)},
            "tolerations": [
                {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        }
    from bastion.runners.google.gce import gpu_machine

    gpu = gpu_machine(text if text.startswith("gpu-") else f"gpu-{text}") if text else None
    if gpu:
        machine, count = gpu
        selector = {"node.kubernetes.io/instance-type": machine}
        family = machine.rsplit("-", 1)[0]
        if family in _GPU_ACCELERATOR:
            selector["cloud.google.com/gke-accelerator"] = _GPU_ACCELERATOR[family]
        return {
            "slices": 1,
            "hosts": replicas,
            "tpu": False,
            "what": machine,
            "selector": selector,
            "limits": {"nvidia.com/gpu": str(count)},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        }
    raise RunnerError(
        f"the gke runner needs options instance_type like tpu-v5p-128 or gpu-a3-highgpu-8g "
        f"(or accelerator_type / machine_type), not {text!r}"
    )


def capacity(
    options: Mapping[str, Any], tier: int | None, tiers: Mapping[Any, Any], default_spot: bool
) -> tuple[str, str | None]:
    """("spot" | "on-demand" | "reserved", reservation or None): the job's own ``reservation``
    or ``spot`` option, else ``tiers`` for the tier it was admitted on, else the default."""
    if options.get("reservation"):
        return "reserved", str(options["reservation"])
    if "spot" in options:
        return ("spot" if options["spot"] else "on-demand"), None
    said = {str(k): str(v) for k, v in tiers.items()}.get(str(tier)) if tier is not None else None
    if said is None:
        return ("spot" if default_spot else "on-demand"), None
    if said.startswith("reservation:"):
        return "reserved", said.split(":", 1)[1]
    if said not in ("spot", "on-demand"):
        raise RunnerError(
            f"runner gke: tiers.{tier} = {said!r} is not spot, on-demand or "
            "reservation:<name>; fix [runners.gke] tiers"
        )
    return said, None


def _brief(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def api_message(error: Exception) -> str:
    """The apiserver's Status message of an ApiException (its body), else the error's text."""
    body = getattr(error, "body", None)
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        status = {}
    return _brief(status.get("message") or getattr(error, "reason", None) or str(error))


def refusal(error: Exception, verb: str, what: str) -> Exception:
    """What an ApiException means for the job: RunnerError (the user acts) or TryAgain."""
    code = int(getattr(error, "status", 0) or 0)
    message = api_message(error)
    if code in RETRYABLE_STATUS:
        return TryAgain(f"{verb} {what}: the apiserver answered {code}: {message}")
    if code == 401:
        return RunnerError(
            f"the cluster refused the daemon's credentials (401 Unauthorized) "
            f"to {verb} {what}: {message}; fix [runners.gke] kubeconfig/context"
        )
    if code == 403:
        return RunnerError(
            f"forbidden to {verb} {what} (403): {message}; grant the daemon's "
            f"account '{verb}' on {PLURAL}.{GROUP} in RBAC"
        )
    if code == 404 and "namespace" in message.lower():
        return RunnerError(f"cannot {verb} {what}: {message}; fix [runners.gke] namespace")
    if code == 404:
        return RunnerError(
            f"cannot {verb} {what}: the JobSet CRD ({PLURAL}.{GROUP}/{VERSION}) is "
            f"not installed in the cluster ({message}); install JobSet "
            "(kubectl apply --server-side -f the JobSet release manifests)"
        )
    return RunnerError(f"the cluster refused to {verb} {what} ({code}): {message}")


# -- the runner --------------------------------------------------------------------------------


class GkeRunner(Runner):
    kind = "gke"

    def __init__(self, settings: Mapping[str, Any], api_client: Any = None) -> None:
        self.settings = dict(settings)
        self.root = str(settings.get("root") or "")
        if not self.root:
            raise RunnerError("the gke runner needs the setting root")
        self.tag = root_tag(self.root)
        self.store = Store(self.root)
        self.namespace = str(settings.get("namespace") or "default")
        self.heartbeat_timeout = float(settings.get("heartbeat_timeout", 120))
        self.flush_seconds = float(settings.get("flush_seconds", 45))
        self.listing_ttl = float(settings.get("listing_ttl", LISTING_TTL))
        self.grace = int(settings.get("termination_grace_seconds", 60))
        self.selector = f"{ROOT_LABEL}={self.tag},{RUNNER_LABEL}={self.kind}"
        self._api_client = api_client
        self._lock = threading.RLock()
        self._per_cycle = False
        self._jobsets: tuple[float, dict[str, dict]] = (float("-inf"), {})
        self._pods: tuple[float, dict[str, list[dict]]] = (float("-inf"), {})
        self._agents: tuple[float, dict[tuple[str, str], dict[str, ObjectInfo]]] = (
            float("-inf"),
            {},
        )
        self._records: dict[str, RemoteRecords] = {}
        self._ended_at: dict[str, float] = {}
        self._package_url: str | None = None
        self.calls = 0  # API calls made (for the benchmark)

    # -- the client ----------------------------------------------------------------------------
    def client(self) -> Any:
        """The kubernetes ApiClient, made on first use: in-cluster, or from a kubeconfig."""
        with self._lock:
            if self._api_client is None:
                from kubernetes import client, config

                try:
                    if self.settings.get("in_cluster"):
                        config.load_incluster_config()
                        self._api_client = client.ApiClient()
                    else:
                        path = (
                            self.settings.get("kubeconfig")
                            or os.environ.get("KUBECONFIG")
                            or os.path.expanduser("~/.kube/config")
                        )
                        if not os.path.exists(str(path).split(os.pathsep)[0]):
                            raise RunnerError(
                                f"runner gke: no kubeconfig at {path}; set [runners.gke] "
                                "kubeconfig (and context), or in_cluster = true in a pod"
                            )
                        self._api_client = config.new_client_from_config(
                            config_file=str(path), context=self.settings.get("context") or None
                        )
                except config.ConfigException as e:
                    raise RunnerError(
                        f"runner gke: cannot load the cluster's config: {e}; "
                        "fix [runners.gke] kubeconfig/context/in_cluster"
                    ) from e
            return self._api_client

    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.client())

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client())

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls += 1
        return fn(*args, **kwargs)

    # -- listings, once per cycle --------------------------------------------------------------
    def begin_cycle(self) -> None:
        with self._lock:
            self._per_cycle = True
            self._jobsets = (float("-inf"), {})
            self._pods = (float("-inf"), {})
            self._agents = (float("-inf"), {})

    def _stale(self, at: float) -> bool:
        if at == float("-inf"):
            return True
        return not self._per_cycle and time.monotonic() - at > self.listing_ttl

    def _list_all(self, fn: Any, *args: Any) -> list[dict]:
        items, token = [], None
        while True:
            kwargs: dict[str, Any] = {"label_selector": self.selector, "limit": 500}
            if token:
                kwargs["_continue"] = token
            page = self._call(fn, *args, **kwargs)
            if not isinstance(page, dict):  # a model (pods): the API's own camelCase JSON
                page = self.client().sanitize_for_serialization(page)
            items += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def jobsets(self, fresh: bool = False) -> dict[str, dict]:
        """This root's JobSets by name (ours by their labels), one list call per cycle."""
        with self._lock:
            at, found = self._jobsets
            if fresh or self._stale(at):
                try:
                    items = self._list_all(
                        self.custom().list_namespaced_custom_object,
                        GROUP,
                        VERSION,
                        self.namespace,
                        PLURAL,
                    )
                except RunnerError:
                    raise
                except Exception as e:
                    if hasattr(e, "status"):
                        raise refusal(e, "list", f"{PLURAL} in namespace {self.namespace}") from e
                    raise TryAgain(f"listing {PLURAL}: {e}") from e
                found = {js["metadata"]["name"]: js for js in items if self._ours(js)}
                self._jobsets = (time.monotonic(), found)
            return found

    def pods(self) -> dict[str, list[dict]]:
        """This root's pods by attempt name (their template's labels), one call per cycle,
        made only when an attempt needs pod detail."""
        with self._lock:
            at, found = self._pods
            if self._stale(at):
                items = self._list_all(self.core().list_namespaced_pod, self.namespace)
                found = {}
                for pod in items:
                    attempt = (pod["metadata"].get("labels") or {}).get(ATTEMPT_LABEL)
                    if attempt:
                        found.setdefault(attempt, []).append(pod)
                self._pods = (time.monotonic(), found)
            return found

    def agent_listing(self) -> dict[tuple[str, str], dict[str, ObjectInfo]]:
        with self._lock:
            at, found = self._agents
            if self._stale(at):
                found = self.store.agents.list_all()
                self._agents = (time.monotonic(), found)
            return found

    def _invalidate(self, always: bool = True) -> None:
        """The next look at the JobSets lists afresh: after a create always (the attempt's
        first poll must see it), after a delete only without a daemon (with one, the next
        cycle's listing shows it: a listing per deleted job would grow with the jobs)."""
        if always or not self._per_cycle:
            with self._lock:
                self._jobsets = (float("-inf"), self._jobsets[1])

    def _ours(self, js: dict) -> bool:
        """Labelled with this root and runner, and named after the attempt its label names."""
        meta = js.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(ROOT_LABEL) != self.tag or labels.get(RUNNER_LABEL) != self.kind:
            return False
        attempt = labels.get(ATTEMPT_LABEL)
        return bool(attempt) and jobset_name(attempt) == meta.get("name")

    # -- start ---------------------------------------------------------------------------------
    def start(self, attempt: Attempt) -> Handle:
        """Adopt the attempt's JobSet if this root's listing has it, else write the
        provisioning record, check the lease term and create it; 409 is adoption once the
        existing JobSet's labels say it is this attempt."""
        sh = shape(self._options(attempt))
        name = jobset_name(attempt.name)
        record = self.store.runs.read_provision(attempt.job, attempt.name) or {}
        handle = self._handle(attempt.job, attempt.name, name, sh, record.get("time"))
        if name in self.jobsets(fresh=not self._per_cycle):
            return handle
        body = self.manifest(attempt, sh)
        created = time.time()
        self.store.runs.write_provision(
            attempt.job,
            attempt.name,
            {
                "kind": self.kind,
                "name": attempt.name,
                "jobset": name,
                "namespace": self.namespace,
                "workers": sh["slices"] * sh["hosts"],
                "root_tag": self.tag,
                "time": created,
            },
        )
        check_term(self.store, attempt)  # the apiserver takes no fencing token
        try:
            self._call(
                self.custom().create_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                body,
            )
        except Exception as e:
            if getattr(e, "status", None) == 409:
                self._adopt_existing(name, attempt)
            elif hasattr(e, "status"):
                raise refusal(e, "create", f"JobSet {name} in namespace {self.namespace}") from e
            else:
                raise TryAgain(f"creating JobSet {name}: {e}") from e
        self._invalidate()
        handle["created"] = created
        return handle

    def _adopt_existing(self, name: str, attempt: Attempt) -> None:
        """A 409: the JobSet exists. Ours (a lost answer, a daemon killed after the create)
        when its labels name this root and attempt; anything else is a name clash."""

        def labels_of(found: dict[str, Any]) -> dict[str, str]:
            return (found.get("metadata") or {}).get("labels") or {}

        back = read_back(
            lambda: self._jobset_or_none(name),
            lambda found: (
                labels_of(found).get(ROOT_LABEL) == self.tag
                and labels_of(found).get(ATTEMPT_LABEL) == attempt.name
            ),
        )
        if back.found is None:  # deleted in between: create next cycle
            raise TryAgain(f"JobSet {name} existed and is gone now")
        labels = labels_of(back.found)
        if not back.ours:
            raise RunnerError(
                f"a JobSet named {name} already exists in namespace "
                f"{self.namespace} and is not this attempt's (labels {labels}); "
                "delete it or use another namespace"
            )

    def _jobset_or_none(self, name: str) -> dict[str, Any] | None:
        """The JobSet ``name`` as the apiserver has it; None when it does not exist."""
        try:
            found: dict[str, Any] = self._call(
                self.custom().get_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
            )
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise
        return found

    def _options(self, attempt: Attempt) -> dict[str, Any]:
        """The job's options over the settings' defaults (``instance_type``, ``num_replicas``):
        a spec that names no machine runs on the cluster's default one."""
        defaults = {
            k: self.settings[k]
            for k in ("instance_type", "num_replicas", "topology")
            if k in self.settings
        }
        if any(
            attempt.options.get(k) for k in ("instance_type", "accelerator_type", "machine_type")
        ):
            defaults.pop("instance_type", None)
        return {**defaults, **attempt.options}

    def _handle(
        self, job: str, attempt: str, name: str, sh: Mapping[str, Any], created: float | None
    ) -> Handle:
        handle: Handle = {
            "name": attempt,
            "job": job,
            "jobset": name,
            "namespace": self.namespace,
            "slices": sh["slices"],
            "workers": sh["slices"] * sh["hosts"],
            "what": sh["what"],
        }
        if created is not None:
            handle["created"] = created
        return handle

    def package_url(self) -> str | None:
        if self.settings.get("package_url") or not self.settings.get("publish_package", True):
            return self.settings.get("package_url")
        with self._lock:
            if self._package_url is None:
                self._package_url = self.store.packages.put(*startup.package_wheel())
            return self._package_url

    def manifest(self, attempt: Attempt, sh: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JobSet for the attempt (a plain dict, as the apiserver stores it)."""
        sh = sh or shape(self._options(attempt))
        name = jobset_name(attempt.name)
        image = attempt.options.get("image") or self.settings.get("image")
        if not image:
            raise RunnerError(
                "runner gke: no image; set [runners.gke] image (an image with "
                "bastion installed, e.g. the Dockerfile's worker target) or the "
                "job's runner option image"
            )
        slices, hosts = int(sh["slices"]), int(sh["hosts"])
        from bastion.runners.google.api import labels_for

        labels = labels_for(attempt, self.tag, self.kind)
        queue = attempt.options.get("queue") or self.settings.get("queue")
        js_labels = dict(labels)
        if queue:
            js_labels[QUEUE_LABEL] = str(queue)
        agent_args = [*(self.settings.get("agent_args") or []), f"--worker_env={WORKER_ENV}"]
        if slices > 1:
            agent_args += [f"--num_slices={slices}", "--slices_from_env"]
        if attempt.bundle:
            agent_args.append(f"--bundle={json.dumps(dict(attempt.bundle), sort_keys=True)}")
        script = startup.script(
            root=self.root,
            job=attempt.job,
            attempt=attempt.name,
            num_workers=slices * hosts,
            command=attempt.command,
            env=attempt.env,
            python=str(self.settings.get("python") or "python3"),
            package_url=self.package_url(),
            agent_args=agent_args,
        )

        def annotation(key: str) -> dict[str, Any]:
            return {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}

        env: list[dict[str, Any]] = [{"name": WORKER_ENV, **annotation(COMPLETION_INDEX)}]
        if slices > 1 and sh["tpu"]:
            env += [
                {"name": "MEGASCALE_SLICE_ID", **annotation(JOB_INDEX)},
                {"name": "MEGASCALE_NUM_SLICES", "value": str(slices)},
                {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": f"{name}-{RJOB}-0-0.{name}"},
                {"name": "MEGASCALE_PORT", "value": "8080"},
            ]
        elif slices > 1:
            env += [
                {"name": "MEGASCALE_SLICE_ID", **annotation(JOB_INDEX)},
                {"name": "MEGASCALE_NUM_SLICES", "value": str(slices)},
            ]
        selector = dict(sh["selector"])
        tolerations = list(sh["tolerations"])
        kind, reservation = capacity(
            attempt.options,
            attempt.tier,
            self.settings.get("tiers") or {},
            bool(self.settings.get("spot", False)),
        )
        if kind == "spot":
            selector["cloud.google.com/gke-spot"] = "true"
            tolerations.append(
                {
                    "key": "cloud.google.com/gke-spot",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                }
            )
        elif reservation:
            selector["cloud.google.com/reservation-name"] = reservation
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": self.grace,
            "nodeSelector": selector,
            "tolerations": tolerations,
            "containers": [
                {
                    "name": "main",
                    "image": str(image),
                    "command": ["bash", "-c", script],
                    "env": env,
                    "resources": {"limits": dict(sh["limits"])},
                }
            ],
        }
        if self.settings.get("service_account"):
            pod_spec["serviceAccountName"] = str(self.settings["service_account"])
        if self.settings.get("priority_class"):
            pod_spec["priorityClassName"] = str(self.settings["priority_class"])
        annotations = {JOB_ANNOTATION: attempt.job}
        if sh["tpu"]:
            annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] = (
                "cloud.google.com/gke-nodepool"
            )
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "JobSet",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": js_labels,
                "annotations": annotations,
            },
            "spec": {
                "failurePolicy": {"maxRestarts": 0},
                "replicatedJobs": [
                    {
                        "name": RJOB,
                        "replicas": slices,
                        "template": {
                            "spec": {
                                "parallelism": hosts,
                                "completions": hosts,
                                "backoffLimit": 0,
                                "completionMode": "Indexed",
                                "template": {
                                    "metadata": {
                                        "labels": dict(labels),
                                        "annotations": {JOB_ANNOTATION: attempt.job},
                                    },
                                    "spec": pod_spec,
                                },
                            }
                        },
                    }
                ],
            },
        }

    # -- poll ----------------------------------------------------------------------------------
    def records(self, handle: Handle) -> RemoteRecords:
        with self._lock:
            found = self._records.get(handle["name"])
            if found is None:
                found = RemoteRecords(
                    self.store,
                    handle["job"],
                    handle["name"],
                    int(handle["workers"]),
                    self.heartbeat_timeout,
                )
                self._records[handle["name"]] = found
            return found

    def _attempt_records(self, handle: Handle) -> dict[str, ObjectInfo]:
        return self.agent_listing().get((handle["job"], handle["name"]), {})

    def agents(self, handle: Handle) -> Observation | None:
        return self.records(handle).observe(self._attempt_records(handle), time.time())

    def _flushed(self, handle: Handle) -> bool:
        listing = self._attempt_records(handle)
        started = [w for w in range(int(handle["workers"])) if run_name(w, "started") in listing]
        return all(run_name(w, "exit") in listing for w in started)

    def ended(self, handle: Handle, outcome: Observation) -> Observation:
        """The cluster ended the pods (an eviction, Kueue): ``outcome`` once every started
        agent's exit record is in (or ``flush_seconds`` later), unless all had succeeded."""
        name = handle["name"]
        seen = self.agents(handle)
        if seen is not None and seen.phase is AttemptPhase.SUCCEEDED:
            return seen
        if seen is not None and not self._flushed(handle):
            first = self._ended_at.setdefault(name, time.monotonic())
            if time.monotonic() - first < self.flush_seconds:
                return Observation(
                    AttemptPhase.RUNNING,
                    f"{outcome.reason}; the agents are flushing",
                    workers=seen.workers,
                )
        self._ended_at.pop(name, None)
        return outcome

    def gone(self, handle: Handle, why: str) -> Observation:
        """The JobSet is gone or going: what its agents reported once they all finished;
        while started ones still flush (a pod's container outlives its API object by its
        grace period), their word, for at most ``flush_seconds``; else LOST."""
        seen = self.agents(handle)
        if seen is not None and seen.finished and seen.phase is not AttemptPhase.LOST:
            return seen
        if seen is not None and not seen.finished:
            first = self._ended_at.setdefault(handle["name"], time.monotonic())
            if time.monotonic() - first < self.flush_seconds:
                return Observation(
                    AttemptPhase.RUNNING, f"{seen.reason}; {why}", workers=seen.workers
                )
        self._ended_at.pop(handle["name"], None)
        return Observation(AttemptPhase.LOST, why, retryable=True)

    def poll(self, handle: Handle) -> Observation:
        name = handle.get("jobset") or jobset_name(handle["name"])
        js = self.jobsets().get(name)
        if js is None:
            return self.gone(handle, f"JobSet {name} is gone from namespace {self.namespace}")
        if (js.get("metadata") or {}).get("deletionTimestamp"):
            return self.gone(handle, f"JobSet {name} is being deleted")
        conditions = {
            c.get("type"): c
            for c in (js.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"
        }
        queue = ((js.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
        if (js.get("spec") or {}).get("suspend") or "Suspended" in conditions:
            by = f"suspended by Kueue in queue {queue}" if queue else "JobSet suspended"
            if self.agents(handle) is not None:  # it ran: Kueue took it back (evicted)
                return self.ended(
                    handle,
                    Observation(AttemptPhase.PREEMPTED, f"{by} while running", retryable=True),
                )
            return Observation(AttemptPhase.QUEUED, by)
        pods = self.pods().get(handle["name"], [])
        if (disrupted := _disruption(pods)) is not None:
            return self.ended(
                handle, Observation(AttemptPhase.PREEMPTED, disrupted, retryable=True)
            )
        seen = self.agents(handle)
        if "Failed" in conditions:
            if seen is not None and seen.finished:
                return seen
            cond = conditions["Failed"]
            why = f"JobSet {name} failed: {cond.get('reason', '')} {cond.get('message', '')}"
            pod_why = _pod_failure(pods)
            return Observation(
                AttemptPhase.FAILED, _brief(why + (f"; {pod_why}" if pod_why else ""))
            )
        if "Completed" in conditions:
            if seen is not None and seen.finished:
                return seen
            return self.ended(
                handle,
                Observation(
                    AttemptPhase.LOST,
                    f"JobSet {name} completed without every worker's exit record",
                    retryable=True,
                ),
            )
        if seen is not None:
            return seen
        if (pod_why := _pod_failure(pods)) is not None:
            return Observation(AttemptPhase.FAILED, pod_why)
        total = int(handle["workers"])
        scheduled = sum(1 for p in pods if _scheduled(p))
        why = f"{scheduled} of {total} pods scheduled"
        unschedulable = _unschedulable(pods)
        if unschedulable:
            why += f" ({unschedulable})"
        return Observation(AttemptPhase.PROVISIONING, why)

    def read_output(self, handle: Handle, offset: int, limit: int) -> bytes:
        return self.records(handle).read_output(
            offset, limit, worker=0, listing=self._attempt_records(handle)
        )

    def describe(self, handle: Handle) -> str | None:
        n, slices = int(handle.get("workers", 1)), int(handle.get("slices", 1))
        hosts = n // max(1, slices)
        what = handle.get("what", "")
        size = f"{hosts} host{'' if hosts == 1 else 's'}" + (
            f" x {slices} slices" if slices > 1 else ""
        )
        context = self.settings.get("context")
        where = f"namespace {handle.get('namespace', self.namespace)}" + (
            f" of {context}" if context else ""
        )
        return f"JobSet {handle.get('jobset', handle['name'])} ({what}, {size}) in {where}"

    # -- stop and delete -----------------------------------------------------------------------
    def _request_delete(self, name: str) -> None:
        from kubernetes import client

        try:
            self._call(
                self.custom().delete_namespaced_custom_object,
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                grace_period_seconds=self.grace,
                propagation_policy="Foreground",
                body=client.V1DeleteOptions(
                    propagation_policy="Foreground", grace_period_seconds=self.grace
                ),
            )
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return
            if getattr(e, "status", None) in (401, 403):
                raise refusal(e, "delete", f"JobSet {name}") from e
            raise
        self._invalidate(always=False)

    def stop(self, handle: Handle, deadline: float) -> None:
        """Foreground delete with the grace period; past the deadline, the pods at once."""
        name = handle.get("jobset") or jobset_name(handle["name"])
        js = self.jobsets().get(name)
        if js is not None and not (js.get("metadata") or {}).get("deletionTimestamp"):
            self._request_delete(name)
        if time.time() >= deadline:
            for pod in self.pods().get(handle["name"], []):
                try:
                    self._call(
                        self.core().delete_namespaced_pod,
                        pod["metadata"]["name"],
                        self.namespace,
                        grace_period_seconds=0,
                    )
                except Exception as e:
                    if getattr(e, "status", None) != 404:
                        raise

    def delete(self, handle: Handle) -> bool:
        """True once the JobSet is absent from a listing made after the delete call (the
        cycle's; without a daemon a fresh one); then the agents' records go too."""
        if handle.get("jobset") or not handle.get("records_only"):
            name = handle.get("jobset") or jobset_name(handle["name"])
            js = self.jobsets(fresh=not self._per_cycle).get(name)
            if js is not None:
                if not (js.get("metadata") or {}).get("deletionTimestamp"):
                    self._request_delete(name)
                if self._per_cycle or not self._gone_soon(name):
                    return False
        self.store.agents.delete(handle["job"], handle["name"])
        self.forget(handle["name"])
        return True

    def _gone_soon(self, name: str, seconds: float = 5.0) -> bool:
        """Without a daemon (a tool, a test) there is no next cycle to verify the deletion:
        list again for a few seconds (the garbage collector removes the pods in well under a
        second once they stopped). A daemon never waits: its next cycle's listing tells."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if name not in self.jobsets(fresh=True):
                return True
        return False

    def list_owned(self) -> list[Owned]:
        """This root's JobSets (by their labels), plus attempts whose agents' records outlived
        their JobSet (a daemon that died between the two deletions)."""
        owned = []
        for name, js in self.jobsets().items():
            meta = js.get("metadata") or {}
            attempt = meta["labels"][ATTEMPT_LABEL]
            job = (meta.get("annotations") or {}).get(JOB_ANNOTATION) or attempt
            rjobs = (js.get("spec") or {}).get("replicatedJobs") or [{}]
            slices = int(rjobs[0].get("replicas") or 1)
            hosts = int(
                ((rjobs[0].get("template") or {}).get("spec") or {}).get("parallelism") or 1
            )
            conditions = {
                c.get("type")
                for c in (js.get("status") or {}).get("conditions") or []
                if c.get("status") == "True"
            }
            handle = self._handle(
                job, attempt, name, {"slices": slices, "hosts": hosts, "what": ""}, None
            )
            owned.append(Owned(attempt, handle, bool(conditions & {"Completed", "Failed"})))
        names = {item.name for item in owned}
        prefix = f"bst-{self.tag}-"
        for (job, attempt), records in self.agent_listing().items():
            if attempt in names or not attempt.startswith(prefix):
                continue
            provision = self.store.runs.read_provision(job, attempt) or {}
            if provision.get("kind") != self.kind:
                continue  # another runner's attempt: its records are that runner's to sweep
            workers = 1 + max((p[0] for r in records if (p := parse_run_name(r))), default=0)
            handle = {"name": attempt, "job": job, "workers": workers, "records_only": True}
            owned.append(Owned(attempt, handle, True))
        return owned

    def forget(self, name: str) -> None:
        with self._lock:
            self._records.pop(name, None)
            self._ended_at.pop(name, None)

    def close(self) -> None:
        with self._lock:
            self._records.clear()
            if self._api_client is not None and hasattr(self._api_client, "close"):
                self._api_client.close()
            self._api_client = None


# -- pods ---------------------------------------------------------------------------------------


def _conditions(pod: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}


def _scheduled(pod: dict) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    return (_conditions(pod).get("PodScheduled") or {}).get("status") == "True"


def _unschedulable(pods: list[dict]) -> str | None:
    for pod in pods:
        cond = _conditions(pod).get("PodScheduled") or {}
        if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return _brief(f"unschedulable: {cond.get('message', '')}", 200)
    return None


def _disruption(pods: list[dict]) -> str | None:
    """Why the cluster took a pod away (spot node gone, eviction, Kueue), or None."""
    for pod in pods:
        status = pod.get("status") or {}
        cond = _conditions(pod).get("DisruptionTarget") or {}
        name = pod["metadata"]["name"]
        if cond.get("status") == "True":
            detail = cond.get("message") or cond.get("reason") or ""
            return _brief(
                f"pod {name} was evicted ({cond.get('reason', 'DisruptionTarget')}): "
                f"{detail}".rstrip(": ")
            )
        if status.get("phase") == "Failed" and status.get("reason") in DISRUPTED_REASONS:
            return _brief(
                f"pod {name} was {status['reason'].lower()}: {status.get('message', '')}".rstrip(
                    ": "
                )
            )
    return None


def _pod_failure(pods: list[dict]) -> str | None:
    """A pod that died before its agent could say anything: its container's reason."""
    for pod in pods:
        name = pod["metadata"]["name"]
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in FATAL_WAITING:
                return _brief(f"pod {name}: {waiting['reason']}: {waiting.get('message', '')}")
            term = state.get("terminated") or {}
            if term and term.get("exitCode", 0) != 0:
                return _brief(
                    f"pod {name}: container exited with {term.get('exitCode')} "
                    f"({term.get('reason', '')}) {term.get('message', '')}"
                )
        status = pod.get("status") or {}
        if status.get("phase") == "Failed":
            return _brief(
                f"pod {name} failed: {status.get('reason', '')} {status.get('message', '')}"
            )
    return None
