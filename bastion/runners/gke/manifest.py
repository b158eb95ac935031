"""The JobSet for one attempt, as a plain dict (as the apiserver stores it): pure.

Why apart: the manifest is where AXLearn's shape lives (../shared/reference/engines.md 1.2),
and it depends on the attempt, its shape and the settings only, so it is built and tested
without a cluster.

One replicated job ``job`` with ``replicas`` = slices and ``parallelism = completions`` = hosts
per slice (GPU: one replica of ``num_replicas`` hosts), ``backoffLimit: 0`` and
``failurePolicy.maxRestarts: 0``: one attempt is one JobSet, and a preemption is a requeue as a
new attempt. Every pod runs the Bastion agent (:mod:`bastion.runners.startup`); its worker
index is ``slice * hosts + host``, from the Indexed Job's completion index and JobSet's
``job-index`` (downward API), so one command serves every pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bastion.runners import startup
from bastion.runners.base import Attempt, RunnerError
from bastion.runners.gke.shape import (
    GROUP,
    JOB_ANNOTATION,
    QUEUE_LABEL,
    RJOB,
    VERSION,
    jobset_name,
)
from bastion.runners.kit.capacity import capacity

WORKER_ENV = "BASTION_GKE_WORKER_INDEX"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
SPOT_SELECTOR = "cloud.google.com/gke-spot"
RESERVATION_SELECTOR = "cloud.google.com/reservation-name"


@dataclass(frozen=True)
class Placement:
    """Where the runner's settings put every JobSet: the daemon's root and namespace, the
    pods' grace period, the agent's package, and the ``[runners.gke]`` table itself."""

    root: str
    tag: str
    kind: str
    namespace: str
    grace: int
    package_url: str | None
    settings: Mapping[str, Any]


def manifest(attempt: Attempt, sh: Mapping[str, Any], where: Placement) -> dict[str, Any]:
    """The JobSet for the attempt with shape ``sh`` (:func:`bastion.runners.gke.shape.shape`)."""
    from bastion.runners.google.api import labels_for

    name = jobset_name(attempt.name)
    slices, hosts = int(sh["slices"]), int(sh["hosts"])
    labels = labels_for(attempt, where.tag, where.kind)
    js_labels = dict(labels)
    queue = attempt.options.get("queue") or where.settings.get("queue")
    if queue:
        js_labels[QUEUE_LABEL] = str(queue)
    annotations = {JOB_ANNOTATION: attempt.job}
    if sh["tpu"]:
        annotations["alpha.jobset.sigs.k8s.io/exclusive-topology"] = "cloud.google.com/gke-nodepool"
    job_spec = {
        "parallelism": hosts,
        "completions": hosts,
        "backoffLimit": 0,
        "completionMode": "Indexed",
        "template": {
            "metadata": {"labels": dict(labels), "annotations": {JOB_ANNOTATION: attempt.job}},
            "spec": pod_spec(attempt, sh, where),
        },
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": where.namespace,
            "labels": js_labels,
            "annotations": annotations,
        },
        "spec": {
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": [{"name": RJOB, "replicas": slices, "template": {"spec": job_spec}}],
        },
    }


def pod_spec(attempt: Attempt, sh: Mapping[str, Any], where: Placement) -> dict[str, Any]:
    """Every pod of the JobSet: the agent as the command, the shape's selector and limits,
    spot or a reservation per the job's quota tier, account and priority from the settings."""
    image = attempt.options.get("image") or where.settings.get("image")
    if not image:
        raise RunnerError(
            "runner gke: no image; set [runners.gke] image (an image with "
            "bastion installed, e.g. the Dockerfile's worker target) or the "
            "job's runner option image"
        )
    selector, tolerations = _placement(attempt, sh, where.settings)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": where.grace,
        "nodeSelector": selector,
        "tolerations": tolerations,
        "containers": [
            {
                "name": "main",
                "image": str(image),
                "command": ["bash", "-c", agent_script(attempt, sh, where)],
                "env": worker_env(jobset_name(attempt.name), sh),
                "resources": {"limits": dict(sh["limits"])},
            }
        ],
    }
    if where.settings.get("service_account"):
        spec["serviceAccountName"] = str(where.settings["service_account"])
    if where.settings.get("priority_class"):
        spec["priorityClassName"] = str(where.settings["priority_class"])
    return spec


def _placement(
    attempt: Attempt, sh: Mapping[str, Any], settings: Mapping[str, Any]
) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The node selector and tolerations: the shape's, plus spot or a named reservation."""
    selector = dict(sh["selector"])
    tolerations = list(sh["tolerations"])
    kind, reservation = capacity(
        attempt, settings.get("tiers") or {}, bool(settings.get("spot", False)), "gke"
    )
    if kind == "spot":
        selector[SPOT_SELECTOR] = "true"
        tolerations.append(
            {"key": SPOT_SELECTOR, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        )
    elif reservation:
        selector[RESERVATION_SELECTOR] = reservation
    return selector, tolerations


def agent_script(attempt: Attempt, sh: Mapping[str, Any], where: Placement) -> str:
    """The container's command: the startup script that runs the agent (as on TPU VMs)."""
    slices, hosts = int(sh["slices"]), int(sh["hosts"])
    agent_args = [*(where.settings.get("agent_args") or []), f"--worker_env={WORKER_ENV}"]
    if slices > 1:
        agent_args += [f"--num_slices={slices}", "--slices_from_env"]
    if attempt.bundle:
        agent_args.append(f"--bundle={json.dumps(dict(attempt.bundle), sort_keys=True)}")
    return startup.script(
        root=where.root,
        job=attempt.job,
        attempt=attempt.name,
        num_workers=slices * hosts,
        command=attempt.command,
        env=attempt.env,
        python=str(where.settings.get("python") or "python3"),
        package_url=where.package_url,
        agent_args=agent_args,
    )


def worker_env(name: str, sh: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host index from the completion index, and for multislice the slice from JobSet's
    job index (plus MEGASCALE's coordinator on TPUs), all through the downward API."""

    def annotation(key: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}

    slices = int(sh["slices"])
    env: list[dict[str, Any]] = [{"name": WORKER_ENV, **annotation(COMPLETION_INDEX)}]
    if slices > 1:
        env += [
            {"name": "MEGASCALE_SLICE_ID", **annotation(JOB_INDEX)},
            {"name": "MEGASCALE_NUM_SLICES", "value": str(slices)},
        ]
    if slices > 1 and sh["tpu"]:
        env += [
            {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": f"{name}-{RJOB}-0-0.{name}"},
            {"name": "MEGASCALE_PORT", "value": "8080"},
        ]
    return env
