"""From a JobSet, its pods and its agents' records to an :class:`Observation`.

Why apart: the phase mapping is the runner's one judgement (issue 23), and it reads only what
the cycle's listings already hold, so it makes no call of its own. The agents' word (through
:class:`bastion.runners.kit.channel.AgentChannel`) wins as everywhere: a JobSet that is gone
or ended reports what the agents said once they flushed.

- JobSet absent (after create) or being deleted: the agents' word, else LOST;
- ``spec.suspend`` / ``Suspended``: QUEUED ("suspended by Kueue in queue Q"), or PREEMPTED
  once its agents had started (Kueue evicted it);
- a pod with a ``DisruptionTarget`` condition, or evicted/terminated by its node: PREEMPTED
  (after the agents' last flush);
- ``Failed``: the agents' exit code, else FAILED with the condition's reason and any pod's own
  (image pull, bad command);
- ``Completed``: the agents' records (SUCCEEDED once every exit record is in);
- otherwise the agents' records, or PROVISIONING "k of N pods scheduled".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bastion.runners.base import AttemptPhase, Handle, Observation
from bastion.runners.gke.errors import brief
from bastion.runners.gke.shape import QUEUE_LABEL
from bastion.runners.kit.channel import AgentChannel

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


def true_conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The object's status conditions that hold, by type."""
    return {
        c.get("type"): c
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }


def observe(
    channel: AgentChannel,
    handle: Handle,
    js: dict[str, Any],
    pods_of: Callable[[], list[dict[str, Any]]],
) -> Observation:
    """The attempt whose JobSet ``js`` is listed (and not being deleted). ``pods_of`` lists
    its pods: called only when the JobSet is neither suspended nor holds all the answer."""
    name = js["metadata"]["name"]
    conditions = true_conditions(js)
    queue = (js["metadata"].get("labels") or {}).get(QUEUE_LABEL)
    if (js.get("spec") or {}).get("suspend") or "Suspended" in conditions:
        by = f"suspended by Kueue in queue {queue}" if queue else "JobSet suspended"
        if channel.agents(handle) is not None:  # it ran: Kueue took it back (evicted)
            return channel.preempted(handle, f"{by} while running")
        return Observation(AttemptPhase.QUEUED, by)
    pods = pods_of()
    if (disrupted := disruption(pods)) is not None:
        return channel.preempted(handle, disrupted)
    seen = channel.agents(handle)
    if "Failed" in conditions:
        if seen is not None and seen.finished:
            return seen
        cond = conditions["Failed"]
        why = f"JobSet {name} failed: {cond.get('reason', '')} {cond.get('message', '')}"
        pod_why = pod_failure(pods)
        return Observation(AttemptPhase.FAILED, brief(why + (f"; {pod_why}" if pod_why else "")))
    if "Completed" in conditions:
        if seen is not None and seen.finished:
            return seen
        return channel.ended(
            handle,
            Observation(
                AttemptPhase.LOST,
                f"JobSet {name} completed without every worker's exit record",
                retryable=True,
            ),
        )
    if seen is not None:
        return seen
    return provisioning(pods, int(handle["workers"]))


def provisioning(pods: list[dict[str, Any]], total: int) -> Observation:
    """No agent started yet: a pod that died first fails the job with its reason; else
    PROVISIONING with how many pods are scheduled (and why not, when the scheduler said)."""
    if (pod_why := pod_failure(pods)) is not None:
        return Observation(AttemptPhase.FAILED, pod_why)
    scheduled = sum(1 for p in pods if _scheduled(p))
    why = f"{scheduled} of {total} pods scheduled"
    if unschedulable := _unschedulable(pods):
        why += f" ({unschedulable})"
    return Observation(AttemptPhase.PROVISIONING, why)


def _conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}


def _scheduled(pod: dict[str, Any]) -> bool:
    if (pod.get("spec") or {}).get("nodeName"):
        return True
    return (_conditions(pod).get("PodScheduled") or {}).get("status") == "True"


def _unschedulable(pods: list[dict[str, Any]]) -> str | None:
    for pod in pods:
        cond = _conditions(pod).get("PodScheduled") or {}
        if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return brief(f"unschedulable: {cond.get('message', '')}", 200)
    return None


def disruption(pods: list[dict[str, Any]]) -> str | None:
    """Why the cluster took a pod away (spot node gone, eviction, Kueue), or None."""
    for pod in pods:
        status = pod.get("status") or {}
        cond = _conditions(pod).get("DisruptionTarget") or {}
        name = pod["metadata"]["name"]
        if cond.get("status") == "True":
            detail = cond.get("message") or cond.get("reason") or ""
            return brief(
                f"pod {name} was evicted ({cond.get('reason', 'DisruptionTarget')}): "
                f"{detail}".rstrip(": ")
            )
        if status.get("phase") == "Failed" and status.get("reason") in DISRUPTED_REASONS:
            said = f"pod {name} was {status['reason'].lower()}: {status.get('message', '')}"
            return brief(said.rstrip(": "))
    return None


def pod_failure(pods: list[dict[str, Any]]) -> str | None:
    """A pod that died before its agent could say anything: its container's reason."""
    for pod in pods:
        name = pod["metadata"]["name"]
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in FATAL_WAITING:
                return brief(f"pod {name}: {waiting['reason']}: {waiting.get('message', '')}")
            term = state.get("terminated") or {}
            if term and term.get("exitCode", 0) != 0:
                return brief(
                    f"pod {name}: container exited with {term.get('exitCode')} "
                    f"({term.get('reason', '')}) {term.get('message', '')}"
                )
        status = pod.get("status") or {}
        if status.get("phase") == "Failed":
            return brief(
                f"pod {name} failed: {status.get('reason', '')} {status.get('message', '')}"
            )
    return None
