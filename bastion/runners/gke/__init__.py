"""The GKE runner (kind ``gke``): one JobSet (``jobset.x-k8s.io/v1alpha2``) per attempt, through
the official ``kubernetes`` Python client, the path AXLearn's own bastion takes on GKE.

Every pod's container command is the Bastion agent (the startup script of
:mod:`bastion.runners.startup`, as on TPU and GCE VMs): it fetches the bundle, runs the user's
command with the usual ``BASTION_*`` variables, and writes output chunks and exit records to the
bucket, where the runner kit's agent channel reads them.

The package, by concern:

- :mod:`.shape`: names and shapes (pure): the JobSet's name, AXLearn's instance types as
  slices, hosts, node selectors and limits.
- :mod:`.manifest`: the JobSet for an attempt (pure).
- :mod:`.errors`: the apiserver's refusals as one clear reason, or a retry.
- :mod:`.cluster`: the client, counted calls, and this root's JobSets and pods listed once
  per cycle.
- :mod:`.observe`: a JobSet, its pods and its agents' records as an Observation.
- :mod:`.runner`: :class:`GkeRunner`, composing them with the kit's agent channel.

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

Ownership is decided by the labels ``bastion-root``, ``bastion-runner: gke`` and
``bastion-attempt-name``, never by a name alone; the pod template carries them too.

Cost per cycle: one label-selected list of this root's JobSets for every poll, start and
delete, one list of their pods only when an attempt needs pod detail, and one listing of the
agents' records. Nothing grows with the number of jobs but the size of the answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bastion.runners.gke.errors import api_message, refusal
from bastion.runners.gke.runner import GkeRunner
from bastion.runners.gke.shape import (
    MAX_JOBSET_NAME,
    is_instance_type,
    jobset_name,
    shape,
    topology,
)


def from_settings(settings: Mapping[str, Any]) -> GkeRunner:
    return GkeRunner(settings)


__all__ = [
    "MAX_JOBSET_NAME",
    "GkeRunner",
    "api_message",
    "from_settings",
    "is_instance_type",
    "jobset_name",
    "refusal",
    "shape",
    "topology",
]
