"""A job's lifecycle as one table: ``transition(state, event, now) -> (state, effects)``.

Pure: no I/O, no runner, no clock but ``now``. The daemon turns what it sees (the policy's
decisions, user requests, a runner's observations) into events, feeds them here, and executes
the effects it gets back (start, stop, delete an attempt; a line in the job's log) apart from
deciding them. Every legal move is in the table below; an event that has no row for the
job's status changes nothing.

    status      event                           -> status       effects
    any         Detected (first spec)           -> same         -   (identity, digest, PENDING line)
    PENDING     SpecChanged                     -> PENDING      -   (digest, UPDATED line)
    unfinished  SpecRefused (update unparsable) -> same         -   (reason only)
    PENDING     Admit(tier)                     -> ACTIVE       Log(start), Start(run)
    PENDING     Reject | Cancel                 -> COMPLETED    -
    PENDING     DependencyFailed                -> COMPLETED (CANCELLED)   -
    PENDING     Wait(reason) | QuotaInvalid     -> PENDING      -   (reason only)
    ACTIVE      Started(handle)                 -> ACTIVE       -   (handle recorded)
    any         StartAgain (recorded, unstarted) -> same        Start
    ACTIVE      StartFailed (the job's error)   -> COMPLETED    Log(failed), Delete(run)
    ACTIVE      StartDeferred (transient)       -> ACTIVE       -   (reason; the first deferral's
                                                                 time in the record; the daemon
                                                                 retries, backing off)
    ACTIVE      StartDeferred past give_up_after -> COMPLETED   Log(failed), Delete(run)
    ACTIVE      ... and requeue (CannotStart)   -> PENDING      Log, Delete(run) ("could not start")
    CANCELLING  StartDeferred                   -> COMPLETED (CANCELLED)   Log, Delete(run)
    CANCELLING  Tick, its start deferred        -> COMPLETED (CANCELLED)   Log, Delete(run)
    ACTIVE      Observed(queued|provisioning|running) -> ACTIVE -   (phase; running_since;
                                                                 each worker's health)
    unfinished  Blind / Sighted                 -> same         -   (could-not-watch reason, undone)
    ACTIVE      TierKept(tier)                  -> ACTIVE       -   (tier; never a restart)
    unfinished  ActFailed                       -> same         -   (reason only)
    ACTIVE      Preempt | Update                -> ACTIVE       Stop(run)   (stop recorded)
    ACTIVE      Cancel                          -> CANCELLING   Stop(run)
    ACTIVE      TimedOut (its time limit)       -> ACTIVE       Stop(run)   (stop recorded)
    ACTIVE      Observed(finished), stopped for its time limit -> CLEANING or COMPLETED
                                                                 (TIMEOUT), never requeued
    ACTIVE      Observed(finished), stopped for preempt/update -> PENDING   Log(end), Delete
    ACTIVE      Observed(preempted by provider | lost)         -> PENDING   Log(end), Delete
    ACTIVE      Observed(failed, retryable, no exit code)      -> PENDING   Log(end), Delete
    ACTIVE      Observed(succeeded | failed)    -> CLEANING or COMPLETED    Log(end), Delete,
                                                                 Start(cleanup) if any
    CANCELLING  Observed(finished)              -> CLEANING or COMPLETED (CANCELLED)
    CLEANING    Observed(finished) on cleanup   -> COMPLETED    Delete(cleanup)
    any active  Tick                            -> same         Stop(run) again while stopping
    any         Noted(event, text)              -> same         -   (a history line only)

The rows are data (:data:`ROWS`, first match wins); every history line and every change of a
job's state, the daemon's own included, goes through :func:`transition`.

The attempt record (``state.run_attempt`` / ``state.cleanup_attempt``, an
:class:`~bastion.attempt_records.AttemptRecord`; JSON keys ``runner`` / ``cleanup_runner``) is
the daemon's own: kind, name, handle, origin, phase; ``handle`` is the runner's and opaque here.
It is written to the bucket *before* the attempt is started (the daemon writes states before
it executes effects), so a daemon that dies at any point finds the attempt by its name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bastion.jobstate import AttemptRecord, JobState, Outcome, Status, StopKind
from bastion.lifecycle_observe import (
    cancelled_before_start,
    observed,
    start_deferred,
    start_failed,
)
from bastion.lifecycle_records import (
    CLEANUP,
    NOT_STARTED,
    RUN,
    Delete,
    Effect,
    Log,
    NeedsCleanup,
    Result,
    Start,
    Stop,
    add_event,
    attempt_record,
    attributed,
    complete,
    fmt_time,
    history_line,
    set_record,
    start_marker,
    stop_attempt,
)
from bastion.runners.base import Handle, Observation

__all__ = [  # the effects and helpers re-exported: the daemon and tests name them from here
    "CLEANUP",
    "NOT_STARTED",
    "RUN",
    "Delete",
    "Effect",
    "Log",
    "NeedsCleanup",
    "Result",
    "Start",
    "Stop",
    "attempt_record",
    "attributed",
    "fmt_time",
    "start_marker",
]


# -- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    tier: int | None
    reason: str
    attempt_name: str  # the name the new attempt will have (derived by the daemon)
    runner_kind: str
    log_size: int  # bytes in the job's log before the start marker
    backfill_for: tuple[str, ...] = ()  # started as backfill in capacity held for these jobs
    spec_digest: str = ""  # the spec this attempt runs
    log_start: int | None = None  # where the job's log begins (its first attempt only)


@dataclass(frozen=True)
class Reject:
    reason: str


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Preempt:
    reason: str
    by: str | None
    grace: float


@dataclass(frozen=True)
class Update:
    reason: str
    grace: float


@dataclass(frozen=True)
class Cancel:
    reason: str
    grace: float


@dataclass(frozen=True)
class TimedOut:
    """The job's running time reached its time limit (Slurm's ``--time``): its attempt is
    stopped as a cancel is (the stop signal, the grace, then SIGKILL) and the job ends
    TIMEOUT, never requeued. A cancel already in progress wins."""

    reason: str
    grace: float


@dataclass(frozen=True)
class DependencyFailed:
    """A job it waits for ended otherwise than required (failed, cancelled, timed out) or is
    gone: it can never start (Slurm's DependencyNeverSatisfied), so it ends CANCELLED."""

    reason: str


@dataclass(frozen=True)
class Started:
    purpose: str
    handle: Handle


@dataclass(frozen=True)
class StartFailed:
    purpose: str
    error: str


@dataclass(frozen=True)
class StartDeferred:
    """The runner cannot start the attempt yet (TryAgain: a blocked region, a busy claim, an
    unreachable engine); the daemon tries again, backing off. The reason changes, and the
    record keeps when the first try failed: once ``give_up_after`` seconds have passed since,
    the attempt fails with the last reason (None: no bound, a wait for capacity). A job
    cancelled meanwhile ends CANCELLED: nothing was started, so there is nothing to stop."""

    purpose: str
    reason: str
    give_up_after: float | None = None
    # The runner cannot start anything now (credentials, a disabled API): past the bound the
    # attempt ends and the job waits PENDING again, its quota free, instead of failing.
    requeue: bool = False


@dataclass(frozen=True)
class Observed:
    """A runner's observation; a finished one only after its output was read to the end."""

    purpose: str
    observation: Observation


@dataclass(frozen=True)
class CleanupAdmit:
    """Internal follow-up of a finished run: start the cleanup command (names it)."""

    attempt_name: str
    runner_kind: str
    log_size: int


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class Detected:
    """A new job's first spec: its identity, digest and submission id (the daemon draws the
    id: the table has no randomness)."""

    identity: str
    digest: str
    submission: str
    job_id: str


@dataclass(frozen=True)
class SpecChanged:
    """A spec replaced while the job waits: the new one is what will run (``what``: who
    changed what, for the history)."""

    identity: str
    digest: str
    what: str


@dataclass(frozen=True)
class SpecRefused:
    """A spec update that does not parse: the job keeps its last good spec; the reason says
    so and how to fix it."""

    reason: str


@dataclass(frozen=True)
class Blind:
    """The job's attempt could not be watched this cycle (the runner's call failed)."""

    reason: str


@dataclass(frozen=True)
class Sighted:
    """Watching works again: the reason from before the failure comes back."""

    reason_before: str


@dataclass(frozen=True)
class QuotaInvalid:
    """No valid quota file: a waiting job waits for one."""

    reason: str


@dataclass(frozen=True)
class ActFailed:
    """Acting on the policy's decision for the job failed (the daemon's own error)."""

    reason: str


@dataclass(frozen=True)
class TierKept:
    """The policy keeps a running job on another tier: recorded, never a restart."""

    tier: int


@dataclass(frozen=True)
class StartAgain:
    """Start an attempt recorded but not known to be started: at recovery (the daemon died
    between the state write and the start; starts are idempotent by name, so a runner that
    has it adopts it) and when a deferred start's next try is due."""

    purpose: str


@dataclass(frozen=True)
class Noted:
    """A history line that changes nothing else (where an attempt was placed, which node was
    deleted, what was killed after it ended); ``attempt``: the one it is about, when not the
    current one."""

    event: str
    text: str
    attempt: int | None = None


Event = (
    Admit
    | Reject
    | Wait
    | Preempt
    | Update
    | Cancel
    | TimedOut
    | DependencyFailed
    | Started
    | StartFailed
    | StartDeferred
    | Observed
    | CleanupAdmit
    | Tick
    | Detected
    | SpecChanged
    | SpecRefused
    | Blind
    | Sighted
    | QuotaInvalid
    | ActFailed
    | TierKept
    | StartAgain
    | Noted
)


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One legal move: an event of type ``event``, in one of ``statuses`` (None: any), when
    ``when`` holds, is carried out by ``then``. The first row that matches wins; an event with
    no matching row changes nothing (tests/test_lifecycle.py walks every pair)."""

    event: type
    statuses: frozenset[Status] | None
    then: Callable[[Result, Any, float, str, bool], None]
    when: Callable[[JobState, Any], bool] = lambda state, event: True
    says: str = ""  # the move, as the module's table says it


def _only(*statuses: Status) -> frozenset[Status]:
    return frozenset(statuses)


def _reason(result: Result, event: Any, *_: Any) -> None:
    result.state.reason = event.reason


def _cancel_pending(result: Result, event: Cancel, now: float, *_: Any) -> None:
    complete(result, Outcome.CANCELLED, event.reason, now)


def _cancel_active(result: Result, event: Cancel, now: float, *_: Any) -> None:
    result.state.status = Status.CANCELLING
    stop_attempt(result, StopKind.CANCEL, event.reason, now, None, event.grace, force=True)


def _preempt(result: Result, event: Preempt, now: float, *_: Any) -> None:
    result.state.preemptions += 1
    stop_attempt(result, StopKind.PREEMPT, event.reason, now, event.by, event.grace)


def _update(result: Result, event: Update, now: float, *_: Any) -> None:
    stop_attempt(result, StopKind.UPDATE, event.reason, now, None, event.grace)


def _timed_out(result: Result, event: TimedOut, now: float, *_: Any) -> None:
    stop_attempt(result, StopKind.TIMEOUT, event.reason, now, None, event.grace, force=True)


def _started(result: Result, event: Started, *_: Any) -> None:
    record = attempt_record(result.state, event.purpose)
    if record is not None:  # (the row's condition: recorded and unstarted)
        set_record(result.state, event.purpose, record.started(event.handle))


def _unstarted(state: JobState, event: Started | StartAgain) -> bool:
    record = attempt_record(state, event.purpose)
    return record is not None and record.unstarted


def _cleanup_admit(result: Result, event: CleanupAdmit, *_: Any) -> None:
    result.state.cleanup_attempt = AttemptRecord.admitted(
        event.runner_kind, event.attempt_name, event.log_size
    )
    result.effects.append(Start(CLEANUP))


def _tick_cancelled(result: Result, event: Tick, now: float, job: str, cleanup: bool) -> None:
    # Cancelled while its start waits for its next try (the daemon ticks only a job with no
    # effect in flight): no attempt exists, so it ends now, not after a start.
    start_failed(result, RUN, "it was cancelled while waiting to start", now, cleanup)


def _tick_stopping(result: Result, event: Tick, now: float, *_: Any) -> None:
    new = result.state
    stop = new.stop
    assert stop is not None  # (the row's condition)
    deadline = stop.deadline
    if now >= deadline and not stop.forced:
        new.stop = stop.as_forced()
        grace = deadline - stop.since
        result.events.append(
            ("KILLED", f"still running {grace:g}s after it was asked to stop; forced")
        )
    result.effects.append(Stop(RUN, deadline))


def _detected(result: Result, event: Detected, *_: Any) -> None:
    state = result.state
    state.job_identity, state.spec_digest = event.identity, event.digest
    state.submission = state.submission or event.submission
    add_event(result, "PENDING", f"spec detected (job_id={event.job_id})")


def _spec_changed(result: Result, event: SpecChanged, *_: Any) -> None:
    result.state.spec_digest, result.state.job_identity = event.digest, event.identity
    add_event(result, "UPDATED", f"{event.what} (while pending)")


def _sighted(result: Result, event: Sighted, *_: Any) -> None:
    result.state.reason = event.reason_before


def _tier_kept(result: Result, event: TierKept, *_: Any) -> None:
    result.state.tier = event.tier


def _start_again(result: Result, event: StartAgain, *_: Any) -> None:
    result.effects.append(Start(event.purpose))


def _noted(result: Result, event: Noted, *_: Any) -> None:
    result.notes.append((event.event, event.text, event.attempt))


_ACTIVE = _only(Status.ACTIVE)
_PENDING = _only(Status.PENDING)
_UNFINISHED = _only(Status.PENDING, Status.ACTIVE, Status.CANCELLING, Status.CLEANING)

ROWS: tuple[Row, ...] = (
    Row(Admit, _PENDING, lambda r, e, now, job, _: _admit(r, e, job, now), says="-> ACTIVE"),
    Row(
        Reject,
        _PENDING,
        lambda r, e, now, *_: complete(r, Outcome.REJECTED, e.reason, now),
        says="-> COMPLETED (REJECTED)",
    ),
    Row(Wait, _PENDING, _reason, says="reason only"),
    Row(Cancel, _PENDING, _cancel_pending, says="-> COMPLETED (CANCELLED)"),
    Row(
        DependencyFailed,
        _PENDING,
        lambda r, e, now, *_: complete(r, Outcome.CANCELLED, e.reason, now),
        says="-> COMPLETED (CANCELLED)",
    ),
    Row(Cancel, _ACTIVE, _cancel_active, says="-> CANCELLING, Stop(run)"),
    Row(Preempt, _ACTIVE, _preempt, lambda s, e: not s.stop, says="Stop(run), stop recorded"),
    Row(Update, _ACTIVE, _update, says="Stop(run), stop recorded"),
    Row(
        TimedOut,
        _ACTIVE,
        _timed_out,
        lambda s, e: s.stop is None or s.stop.kind != StopKind.TIMEOUT,
        says="Stop(run), TIMEOUT at its end",
    ),
    Row(Started, None, _started, _unstarted, says="handle recorded"),
    Row(
        StartFailed,
        None,
        lambda r, e, now, job, c: start_failed(r, e.purpose, e.error, now, c),
        says="-> COMPLETED, Log(failed), Delete(run)",
    ),
    Row(
        StartDeferred,
        None,
        lambda r, e, now, job, c: start_deferred(
            r, e.purpose, e.reason, e.give_up_after, now, c, e.requeue
        ),
        lambda s, e: bool(attempt_record(s, e.purpose)),
        says="reason; or gives up",
    ),
    Row(
        Observed,
        None,
        lambda r, e, now, job, c: observed(r, e.purpose, e.observation, now, c),
        says="phase, health; at the end -> PENDING, CLEANING or COMPLETED",
    ),
    Row(
        CleanupAdmit,
        _only(Status.CLEANING),
        _cleanup_admit,
        lambda s, e: s.cleanup_attempt is None,
        says="Start(cleanup)",
    ),
    Row(
        Tick,
        None,
        _tick_cancelled,
        lambda s, e: cancelled_before_start(s),
        says="-> COMPLETED (CANCELLED)",
    ),
    Row(
        Tick,
        None,
        _tick_stopping,
        lambda s, e: s.stop is not None and s.run_attempt is not None,
        says="Stop(run) again; KILLED past the deadline",
    ),
    Row(Detected, None, _detected, lambda s, e: not s.job_identity, says="identity recorded"),
    Row(SpecChanged, _PENDING, _spec_changed, says="digest recorded, UPDATED"),
    Row(SpecRefused, _UNFINISHED, _reason, says="reason only"),
    Row(Blind, _UNFINISHED, _reason, says="reason only"),
    Row(
        Sighted,
        None,
        _sighted,
        lambda s, e: s.reason.startswith("could not watch attempt"),
        says="reason from before",
    ),
    Row(QuotaInvalid, _PENDING, _reason, says="reason only"),
    Row(ActFailed, _UNFINISHED, _reason, says="reason only"),
    Row(TierKept, _ACTIVE, _tier_kept, lambda s, e: s.tier != e.tier, says="tier recorded"),
    Row(StartAgain, None, _start_again, _unstarted, says="Start again (idempotent by name)"),
    Row(Noted, None, _noted, says="history line only"),
)


def row_for(state: JobState, event: Any) -> Row | None:
    """The row that carries ``event`` out in ``state``; None: it changes nothing."""
    for row in _rows_of(type(event)):
        if (row.statuses is None or state.status in row.statuses) and row.when(state, event):
            return row
    return None


@functools.cache
def _rows_of(kind: type) -> tuple[Row, ...]:
    """The rows an event of this kind may match, in the table's order (a recovery feeds the
    table two events per job: a walk down all of it for each was 1.4 s of 100,000 jobs')."""
    return tuple(row for row in ROWS if issubclass(kind, row.event))


def transition(
    state: JobState, event: Event, now: float, *, job: str = "", has_cleanup: bool = False
) -> Result:
    """The next state and the effects to carry out; ``state`` itself is not modified. The
    history lines the move produced are in the new state (and in ``Result.events`` /
    ``Result.notes`` for the daemon's log)."""
    row = row_for(state, event)
    if row is None:
        return Result(state)
    new = state.copy()
    result = Result(new)
    row.then(result, event, now, job, has_cleanup)
    for name, reason in result.events:  # an event's reason is the job's reason from now on
        new.reason = reason
        history_line(new, now, name, reason)
    for name, text, attempt in result.notes:
        history_line(new, now, name, text, attempt)
    return result


def _admit(result: Result, event: Admit, job: str, now: float) -> None:
    state = result.state
    if event.spec_digest:
        state.spec_digest = event.spec_digest
    if state.attempt == 0 and event.log_start is not None:
        state.log_start = event.log_start
    state.attempt += 1
    state.status = Status.ACTIVE
    state.tier = event.tier
    state.start_time = now
    state.running_since = None
    state.end_time = None
    state.exit_code = None
    state.pending_since = None
    if event.backfill_for:  # the policy reclaims it for these jobs (see quota/engine.py)
        state.metadata = {**state.metadata, "backfill_for": list(event.backfill_for)}
    marker = start_marker(job, state.attempt, event.tier, now)
    origin = event.log_size + len(marker.encode())
    state.run_attempt = AttemptRecord.admitted(event.runner_kind, event.attempt_name, origin)
    result.effects += [Log(RUN, marker), Start(RUN)]
    add_event(result, "STARTED", f"attempt {state.attempt} started: {event.reason}")
