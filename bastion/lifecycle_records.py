"""The lifecycle's effects, its ``Result`` and the moves every row shares (record an event,
stop, requeue, finish, complete): the vocabulary of :mod:`bastion.lifecycle`, kept apart so
the table itself reads as a table. Pure, like the table: no I/O, no clock but ``now``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from bastion.jobspec import user_label
from bastion.jobstate import AttemptRecord, JobState, Outcome, Status, StopKind, StopRecord
from bastion.runners.base import Handle

RUN, CLEANUP = "run", "cleanup"
CLEANING_NOTE = "; running the cleanup command"


# -- effects ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    purpose: str


@dataclass(frozen=True)
class Stop:
    purpose: str
    deadline: float


@dataclass(frozen=True)
class Delete:
    purpose: str
    kind: str
    name: str
    handle: Handle | None


@dataclass(frozen=True)
class Log:
    purpose: str
    text: str


@dataclass(frozen=True)
class NeedsCleanup:
    """The run ended and the spec has a cleanup command: the daemon names the attempt and
    feeds back CleanupAdmit (names are the daemon's, not the table's)."""


Effect = Start | Stop | Delete | Log | NeedsCleanup


@dataclass
class Result:
    state: JobState
    effects: list[Effect] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # (event, reason) for history
    notes: list[tuple[str, str, int | None]] = field(default_factory=list)  # history lines only


NOT_STARTED = "could not start"  # the reason a requeued job waits with starts with this


def fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


def start_marker(name: str, attempt: int, tier: int | None, now: float) -> str:
    return (
        f"=== [bastion] attempt {attempt} of {name} started at {fmt_time(now)} (tier {tier}) ===\n"
    )


def attempt_record(state: JobState, purpose: str) -> AttemptRecord | None:
    return state.run_attempt if purpose == RUN else state.cleanup_attempt


# -- moves shared by the rows -----------------------------------------------------------------


def history_line(
    state: JobState, now: float, event: str, text: str, attempt: int | None = None
) -> None:
    state.add_event(
        {
            "time": now,
            "event": event,
            "status": state.status.value,
            "attempt": attempt or state.attempt,
            "reason": text,
        }
    )


def add_event(result: Result, event: str, reason: str) -> None:
    result.state.reason = reason
    result.events.append((event, reason))


def set_record(state: JobState, purpose: str, record: AttemptRecord | None) -> None:
    if purpose == RUN:
        state.run_attempt = record
    else:
        state.cleanup_attempt = record


def stop_attempt(
    result: Result,
    kind: StopKind,
    reason: str,
    now: float,
    by: str | None,
    grace: float,
    force: bool = False,
) -> None:
    state = result.state
    earlier = state.stop
    if earlier is not None and earlier.is_cancel:
        return  # a cancel already in progress wins
    if earlier is not None and not force:
        return
    since = earlier.since if earlier is not None else now
    deadline = earlier.deadline if earlier is not None else now + grace
    state.stop = StopRecord(kind=kind, since=since, by=by, deadline=deadline, reason=reason)
    if state.run_attempt is not None:
        result.effects.append(Stop(RUN, deadline))
    # A time limit's stop is TIME_LIMIT in the history; its end, TIMEOUT, is the outcome.
    add_event(result, "TIME_LIMIT" if kind is StopKind.TIMEOUT else kind.value.upper(), reason)


def delete_attempt(result: Result, purpose: str, record: AttemptRecord) -> None:
    result.effects.append(Delete(purpose, record.kind, str(record.name), record.handle))


def requeue(result: Result, reason: str, event: str = "REQUEUED") -> None:
    state = result.state
    state.status = Status.PENDING
    state.tier = None
    state.running_since = None
    state.pending_since = state.end_time  # the attempt's end: when it began to wait again
    add_event(result, event, reason)


def finish_run(
    result: Result, outcome: Outcome, reason: str, now: float, has_cleanup: bool
) -> None:
    state = result.state
    if not has_cleanup:
        complete(result, outcome, reason, now)
        return
    state.outcome = outcome
    state.status = Status.CLEANING
    add_event(result, "CLEANING", f"{reason}{CLEANING_NOTE}")
    result.effects.append(NeedsCleanup())


def complete(result: Result, outcome: Outcome, reason: str, now: float) -> None:
    state = result.state
    state.status = Status.COMPLETED
    state.outcome = outcome
    state.end_time = state.end_time or now
    state.stop = None
    state.running_since = None
    add_event(result, outcome.value, reason)


def attributed(what: str, by: Any, owner: Any) -> str:
    """``cancelled by mallory (owner alice)``: the reason an Update or a Cancel carries into
    the history names who asked (``unknown`` when the request or spec says nobody) and the
    job's owner beside it. Neither is authenticated (the bucket is the boundary): it is what
    the writer's client said, so the history shows who changed a job by accident or on purpose
    and under whose identity it goes on running (the owner's, always)."""
    return f"{what} by {user_label(by)} (owner {user_label(owner)})"
