"""One ledger record per attempt event, computed from a job's state alone (pure).

An attempt is named by ``<job>/<submission>/<attempt>``: the daemon's own submission id and
the attempt number are in the state, so a daemon restarted after a crash names the same
attempt the same way. Records of one attempt are merged by that id when read (an ``end``
record wins over ``open`` ones), so writing one twice — a restart re-declaring what runs, a
retried append — never counts an attempt twice, and an attempt whose ``open`` record was
written before a crash and whose ``end`` record is written by the next daemon counts once.
"""

from __future__ import annotations

from typing import Any

from bastion.jobspec import JobSpec
from bastion.jobstate import JobState, Status

OPEN, END = "open", "end"
# How the policy words an admission beyond the project's quota (quota/engine.py, Pass.start):
# the STARTED event of such an attempt carries it. Pinned by tests/test_usage_ledger.py.
BORROWING = "borrowing idle capacity"
REASON_CHARS = 200  # of an ended attempt's reason: the page's one line, not the whole story
PREEMPTION_EVENTS = frozenset({"PREEMPT", "PROVIDER_PREEMPTED"})
# What ended an attempt that was requeued rather than finished, by its history event.
_REQUEUE_OUTCOMES = {
    "PREEMPT": "PREEMPTED",
    "PROVIDER_PREEMPTED": "PREEMPTED",
    "UPDATE": "UPDATED",
    "LOST": "LOST",
    "PROVISIONING_FAILED": "PROVISIONING_FAILED",
}


def attempt_id(name: str, state: JobState) -> str:
    return f"{name}/{state.submission or 'x'}/{state.attempt}"


def last_checkpoint(state: JobState) -> float | None:
    """When the attempt last saved a checkpoint, where the state reports it (the outputs
    work adds ``last_checkpoint``); work since then is what a preemption loses."""
    value = getattr(state, "last_checkpoint", None)
    if value is None:
        value = state.metadata.get("last_checkpoint")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def attempt_record(
    name: str, spec: JobSpec | None, state: JobState, tier: int | None = None
) -> dict[str, Any] | None:
    """The record of the job's current (``open``) or last ended (``end``) attempt; None when
    it has none (never admitted, or admitted with no spec to say whose it is). ``tier``: the
    tier the attempt ran on when the state no longer says (a requeue clears it)."""
    if spec is None or state.attempt < 1 or state.start_time is None:
        return None
    start = float(state.start_time)
    ended = state.end_time is not None and float(state.end_time) >= start
    meta = spec.metadata
    record: dict[str, Any] = {
        "id": attempt_id(name, state),
        "kind": END if ended else OPEN,
        "job": name,
        "project": meta.project_id,
        "user": meta.user_id,
        "resources": {k: int(v) for k, v in sorted(meta.resources.items())},
        "tier": state.tier if state.tier is not None else tier,
        "runner": (state.run_attempt.kind if state.run_attempt else "") or spec.runner_kind or "",
        "start": start,
        "borrowed": _admitted_borrowing(state),
    }
    if not ended:
        return record
    outcome, preempted, reason = _how_it_ended(state)
    record.update(
        end=float(state.end_time or start),
        outcome=outcome,
        preempted=preempted,
        reason=reason[:REASON_CHARS],
    )
    checkpoint = last_checkpoint(state)
    if preempted and checkpoint is not None and start <= checkpoint <= record["end"]:
        record["checkpoint"] = checkpoint
    return record


def _admitted_borrowing(state: JobState) -> bool:
    """Whether the policy admitted this attempt beyond its project's quota (a borrower,
    preemptible when the owners need their quota back): the attempt's STARTED event says."""
    for event in reversed(state.events):
        if event.get("attempt") == state.attempt and event.get("event") == "STARTED":
            return BORROWING in str(event.get("reason", ""))
    return False


def _how_it_ended(state: JobState) -> tuple[str, bool, str]:
    """The outcome of the last attempt, whether a preemption (the policy's reclaim or the
    provider's) ended it, and why. A finished job's outcome and reason are in its state; a
    requeued one's are those of its attempt's history event that says why it stopped (the
    state's reason has moved on to why it waits again)."""
    if state.status in (Status.COMPLETED, Status.CLEANING) and state.outcome is not None:
        return state.outcome.value, False, state.reason
    mine = [e for e in state.events if e.get("attempt") == state.attempt]
    for event in mine:
        if event.get("event") in PREEMPTION_EVENTS:
            return "PREEMPTED", True, str(event.get("reason", ""))
    for event in reversed(mine):
        outcome = _REQUEUE_OUTCOMES.get(str(event.get("event")))
        if outcome:
            return outcome, False, str(event.get("reason", ""))
    return "REQUEUED", False, state.reason
