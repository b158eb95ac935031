"""From a Slurm job's state (and its agents' word) to an :class:`Observation` (engines.md 4.3).

Why apart: the mapping is the runner's one judgement and reads only what the cycle's listings
hold (plus accounting, once per finished job), so it is kept beside, not inside, the runner
that makes the calls.

- PENDING: QUEUED with Slurm's reason and the job's position in its partition's queue;
- CONFIGURING, and RUNNING before any agent reported: PROVISIONING;
- RUNNING and COMPLETING: RUNNING on the nodes (never finished while Slurm still ends the job,
  so a preemption in progress is not taken for a failure);
- COMPLETED, FAILED, OUT_OF_MEMORY, TIMEOUT: the agents' outcome (exit codes), with Slurm's
  reason for a time limit or memory; TIMEOUT is the job's failure ("time limit"), not requeued;
- CANCELLED that Bastion did not ask for: FAILED with Slurm's reason;
- PREEMPTED, NODE_FAIL, BOOT_FAIL: PREEMPTED (retryable, not the job's failure);
- gone from squeue, accounting and the agents: LOST.

Without agents (``output = shared_fs``) Slurm's own word stands: RUNNING is RUNNING, COMPLETED
is SUCCEEDED, and a failure carries the exit code Slurm recorded.
"""

from __future__ import annotations

from collections.abc import Callable

from bastion.runners.base import AttemptPhase, Observation
from bastion.runners.slurm.squeue import PREEMPTED, Row

LIMITS = {
    "TIMEOUT": "reached its time limit",
    "DEADLINE": "reached its deadline",
    "OUT_OF_MEMORY": "ran out of memory",
}


def _said(reason: str) -> str:
    return f" ({reason})" if reason and reason != "None" else ""


def queued(row: Row, position: int) -> Observation:
    """Pending: Slurm's reason and the place in the partition's queue."""
    why = f"{row.reason}, " if row.reason and row.reason != "None" else ""
    return Observation(
        AttemptPhase.QUEUED,
        f"Slurm job {row.job_id} pending ({why}position {position} in partition {row.partition})",
    )


def live(row: Row, seen: Observation | None, agents: bool) -> Observation:
    """Slurm still has the job on its nodes (RUNNING, COMPLETING, SUSPENDED, ...)."""
    where = f"Slurm job {row.job_id}"
    if row.state == "CONFIGURING":
        return Observation(AttemptPhase.PROVISIONING, f"{where} configuring {row.nodes}")
    if not agents:
        return Observation(AttemptPhase.RUNNING, f"{where} {row.state.lower()} on {row.nodes}")
    if seen is None:
        return Observation(
            AttemptPhase.PROVISIONING,
            f"{where} {row.state.lower()} on {row.nodes}; agents starting",
        )
    ending = ", ending" if seen.finished or row.state != "RUNNING" else ""
    return Observation(
        AttemptPhase.RUNNING,
        f"{seen.reason} on {row.nodes} ({where}{ending})",
        workers=seen.workers,
    )


def ended(
    job_id: int,
    state: str,
    reason: str,
    seen: Observation | None,
    stopped: bool,
    code_of: Callable[[], int | None],
    agents: bool = True,
) -> Observation:
    """The job is over (every process of it is gone): the agents' word, with Slurm's.
    ``stopped``: Bastion asked for the stop; ``code_of()``: the exit code Slurm recorded."""
    where = f"Slurm job {job_id}"
    workers = seen.workers if seen is not None else ()
    if seen is not None and seen.phase is AttemptPhase.SUCCEEDED:
        return seen
    if state in PREEMPTED:
        what = "preempted by Slurm" if state == "PREEMPTED" else f"{state} (node failure)"
        return Observation(
            AttemptPhase.PREEMPTED, f"{what}: {where}", retryable=True, workers=workers
        )
    if state == "CANCELLED" and not stopped:
        return Observation(
            AttemptPhase.FAILED,
            f"{where} was cancelled outside Bastion{_said(reason)}",
            workers=workers,
        )
    if state in LIMITS:
        code = seen.exit_code if seen is not None else code_of()
        return Observation(
            AttemptPhase.FAILED, f"{where} {LIMITS[state]} ({state})", code, workers=workers
        )
    if seen is not None and seen.finished:
        return seen
    if state == "COMPLETED":
        if seen is None and agents:
            return Observation(
                AttemptPhase.LOST, f"{where} completed but no agent reported", retryable=True
            )
        return Observation(AttemptPhase.SUCCEEDED, f"{where} completed", 0, workers=workers)
    code = code_of() if state == "FAILED" else None
    if stopped:
        return Observation(AttemptPhase.FAILED, f"{where} stopped ({state})", code, workers=workers)
    started = "" if seen is not None or not agents else " before its agents started"
    return Observation(
        AttemptPhase.FAILED, f"{where} {state}{started}{_said(reason)}", code, workers=workers
    )
