"""What holds a pending job back before the policy sees it: its dependencies (Slurm's
``--dependency=afterok``/``afterany``) and its group's limit (an array's ``%N``).

Pure: the daemon gathers each named job's status and each group's members and asks here. A job
held back is not offered to the policy, so it holds no quota; a dependency that can no longer
be satisfied ends the job CANCELLED (Slurm's ``DependencyNeverSatisfied``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Display statuses (JobState.display_status, or None: no such job)
SUCCESS = "SUCCEEDED"
ENDED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "REJECTED", "TIMEOUT"})
HOLDING = frozenset({"ACTIVE", "STARTING", "QUEUED", "PROVISIONING", "CANCELLING", "CLEANING"})


class Gate(enum.Enum):
    READY = "ready"  # offer it to the policy
    WAIT = "wait"  # hold it back; the reason says for what
    NEVER = "never"  # a dependency ended otherwise than required: end the job CANCELLED


@dataclass(frozen=True)
class Verdict:
    gate: Gate
    reason: str = ""


def shown(status: str) -> str:
    """A status as a user reads it in "waiting for train (RUNNING)"."""
    return "RUNNING" if status == "ACTIVE" else status


def dependency_verdict(
    after: Iterable[str], any_end: bool, status_of: Mapping[str, str | None]
) -> Verdict:
    """READY once every job in ``after`` has ended (succeeded, unless ``any_end``); NEVER as
    soon as one ended otherwise (or vanished); else WAIT, naming what it waits for."""
    waiting = []
    for name in after:
        status = status_of.get(name)
        if status is None:
            return Verdict(Gate.NEVER, f"dependency {name} no longer exists")
        if status in ENDED:
            if status != SUCCESS and not any_end:
                return Verdict(Gate.NEVER, f"dependency {name} {status}")
            continue
        waiting.append(f"{name} ({shown(status)})")
    if waiting:
        return Verdict(Gate.WAIT, "waiting for " + ", ".join(waiting))
    return Verdict(Gate.READY)


@dataclass(frozen=True)
class Member:
    name: str
    index: int
    status: str  # display status


def group_held(
    group: str, members: Iterable[Member], max_running: int | None
) -> dict[str, Verdict]:
    """Pending members past the group's limit, each with its reason: with ``max_running`` N,
    N less the members holding capacity are offered, lowest index first (Slurm's
    ``--array=0-99%8``)."""
    if max_running is None:
        return {}
    members = list(members)
    holding = sum(1 for m in members if m.status in HOLDING)
    pending = sorted((m for m in members if m.status == "PENDING"), key=lambda m: m.index)
    room = max(0, max_running - holding)
    reason = f"waiting for its group {group}: at most {max_running} of its members run at once"
    return {m.name: Verdict(Gate.WAIT, reason) for m in pending[room:]}


def find_cycle(name: str, after: Iterable[str], after_of: Mapping[str, list[str]]) -> list[str]:
    """A dependency cycle through ``name`` if it waited for ``after``: the path
    ``[name, a, b, name]``, or [] when there is none. ``after_of``: every live job's
    dependencies."""
    stack = [(dep, [name, dep]) for dep in after]
    seen: set[str] = set()
    while stack:
        current, path = stack.pop()
        if current == name:
            return path
        if current in seen:
            continue
        seen.add(current)
        stack.extend((dep, [*path, dep]) for dep in after_of.get(current, ()))
    return []
