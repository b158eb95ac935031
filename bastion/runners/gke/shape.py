"""What a gke job asks the cluster for, and what its JobSet is called: pure functions.

Why apart: the JobSet's name and the pods' shape follow from the attempt and its options
alone (AXLearn's instance types, ../shared/reference/engines.md 1.2), with no client, so the
manifest, the runner and the tests share one answer.

Names: the JobSet is named after the attempt, shortened (the job's slug first) to at most
:data:`MAX_JOBSET_NAME` characters, since the JobSet webhook rejects a JobSet whose longest pod
name ``<js>-job-<slice>-<host>-xxxxx`` exceeds 63.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from bastion.runners.base import RunnerError

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
RJOB = "job"  # the replicated job's name (AXLearn's)
# The longest pod name is <js>-job-<slice>-<host>-xxxxx; up to 4-digit indexes: 20 characters.
MAX_JOBSET_NAME = 63 - len(f"-{RJOB}-9999-9999-xxxxx")
ROOT_LABEL, RUNNER_LABEL, ATTEMPT_LABEL = "bastion-root", "bastion-runner", "bastion-attempt-name"
JOB_ANNOTATION = "bastion-job-name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

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
_ATTEMPT = re.compile(r"(bst-[0-9a-f]{6}-)(.*?)(-[0-9a-f]{8}-a\d+c?)")


def jobset_name(attempt: str) -> str:
    """The JobSet's name for an attempt: the attempt name when it fits
    :data:`MAX_JOBSET_NAME`, else the same with the job's slug cut (the root tag, the hash of
    job and submission, and the attempt number are kept, so it stays unique and deterministic)."""
    if len(attempt) <= MAX_JOBSET_NAME:
        return attempt
    m = _ATTEMPT.fullmatch(attempt)
    if not m:
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


def is_instance_type(text: str) -> bool:
    """An AXLearn instance type the gke runner can place: ``tpu-v5p-128``, ``gpu-a3-highgpu-8g``."""
    try:
        shape({"instance_type": text})
    except RunnerError:
        return False
    return True


def shape(options: Mapping[str, Any]) -> dict[str, Any]:
    """What the job's options ask for: ``slices``, ``hosts`` per slice, ``tpu`` (or GPU),
    ``what`` (for the history), and the node selector, limits and tolerations per pod."""
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
        return _tpu_shape(tpu.group(1), int(tpu.group(2)), replicas, options.get("topology"))
    found = _gpu_shape(text, replicas) if text else None
    if found is not None:
        return found
    raise RunnerError(
        f"the gke runner needs options instance_type like tpu-v5p-128 or gpu-a3-highgpu-8g "
        f"(or accelerator_type / machine_type), not {text!r}"
    )


def _tpu_shape(family: str, cores: int, replicas: int, topo: Any) -> dict[str, Any]:
    """A TPU slice per replica: v5e/v6e count chips as cores; v4/v5p two cores a chip."""
    chips = cores if family in ("v5litepod", "v6e") else max(1, cores // 2)
    hosts = (
        (1 if chips <= 8 else chips // 4) if family in ("v5litepod", "v6e") else max(1, cores // 8)
    )
    topo = str(topo or topology(family, chips))
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
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
    }


def _gpu_shape(text: str, replicas: int) -> dict[str, Any] | None:
    """One slice of ``replicas`` GPU hosts, or None when ``text`` names no GPU machine."""
    from bastion.runners.google.gce import gpu_machine

    gpu = gpu_machine(text if text.startswith("gpu-") else f"gpu-{text}")
    if not gpu:
        return None
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
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
