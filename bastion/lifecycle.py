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
    PENDING     Wait(reason) | QuotaInvalid     -> PENDING      -   (reason only)
    ACTIVE      Started(handle)                 -> ACTIVE       -   (handle recorded)
    any         StartAgain (recorded, unstarted) -> same        Start
    ACTIVE      StartFailed (the job's error)   -> COMPLETED    Log(failed), Delete(run)
    ACTIVE      StartDeferred (transient)       -> ACTIVE       -   (reason; the first deferral's
                                                                 time in the record; the daemon
                                                                 retries, backing off)
    ACTIVE      StartDeferred past give_up_after -> COMPLETED   Log(failed), Delete(run)
    CANCELLING  StartDeferred                   -> COMPLETED (CANCELLED)   Log, Delete(run)
    CANCELLING  Tick, its start deferred        -> COMPLETED (CANCELLED)   Log, Delete(run)
    ACTIVE      Observed(queued|provisioning|running) -> ACTIVE -   (phase; running_since;
                                                                 each worker's health)
    unfinished  Blind / Sighted                 -> same         -   (could-not-watch reason, undone)
    ACTIVE      TierKept(tier)                  -> ACTIVE       -   (tier; never a restart)
    unfinished  ActFailed                       -> same         -   (reason only)
    ACTIVE      Preempt | Update                -> ACTIVE       Stop(run)   (stop recorded)
    ACTIVE      Cancel                          -> CANCELLING   Stop(run)
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

The attempt record (``state.runner`` / ``state.cleanup_runner``) is the daemon's own:
``{"kind", "name", "handle", "origin", "phase"}``; ``handle`` is the runner's and opaque here.
It is written to the bucket *before* the attempt is started (the daemon writes states before
it executes effects), so a daemon that dies at any point finds the attempt by its name.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bastion.jobspec import user_label
from bastion.jobstate import JobState, Outcome, Status, StopKind
from bastion.runners.base import AttemptPhase, Handle, Observation

RUN, CLEANUP = "run", "cleanup"
_CLEANING_NOTE = "; running the cleanup command"


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


def attributed(what: str, by: Any, owner: Any) -> str:
    """``cancelled by mallory (owner alice)``: the reason an Update or a Cancel carries into
    the history names who asked (``unknown`` when the request or spec says nobody) and the
    job's owner beside it. Neither is authenticated (the bucket is the boundary): it is what
    the writer's client said, so the history shows who changed a job by accident or on purpose
    and under whose identity it goes on running (the owner's, always)."""
    return f"{what} by {user_label(by)} (owner {user_label(owner)})"


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


def fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


def start_marker(name: str, attempt: int, tier: int | None, now: float) -> str:
    return (
        f"=== [bastion] attempt {attempt} of {name} started at {fmt_time(now)} (tier {tier}) ===\n"
    )


def attempt_record(state: JobState, purpose: str) -> dict[str, Any] | None:
    return state.runner if purpose == RUN else state.cleanup_runner


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
    _complete(result, Outcome.CANCELLED, event.reason, now)


def _cancel_active(result: Result, event: Cancel, now: float, *_: Any) -> None:
    result.state.status = Status.CANCELLING
    _stop(result, StopKind.CANCEL, event.reason, now, None, event.grace, force=True)


def _preempt(result: Result, event: Preempt, now: float, *_: Any) -> None:
    result.state.preemptions += 1
    _stop(result, StopKind.PREEMPT, event.reason, now, event.by, event.grace)


def _update(result: Result, event: Update, now: float, *_: Any) -> None:
    _stop(result, StopKind.UPDATE, event.reason, now, None, event.grace)


def _started(result: Result, event: Started, *_: Any) -> None:
    record = attempt_record(result.state, event.purpose) or {}
    _set_record(result.state, event.purpose, {**record, "handle": event.handle})


def _unstarted(state: JobState, event: Started) -> bool:
    record = attempt_record(state, event.purpose)
    return record is not None and record.get("handle") is None


def _cleanup_admit(result: Result, event: CleanupAdmit, *_: Any) -> None:
    result.state.cleanup_runner = {
        "kind": event.runner_kind,
        "name": event.attempt_name,
        "handle": None,
        "origin": event.log_size,
        "phase": "STARTING",
    }
    result.effects.append(Start(CLEANUP))


def _tick_cancelled(result: Result, event: Tick, now: float, job: str, cleanup: bool) -> None:
    # Cancelled while its start waits for its next try (the daemon ticks only a job with no
    # effect in flight): no attempt exists, so it ends now, not after a start.
    _start_failed(result, StartFailed(RUN, "it was cancelled while waiting to start"), now, cleanup)


def _tick_stopping(result: Result, event: Tick, now: float, *_: Any) -> None:
    new = result.state
    deadline = float(new.stop["deadline"])
    if now >= deadline and not new.stop.get("forced"):
        new.stop = {**new.stop, "forced": True}
        grace = deadline - float(new.stop["since"])
        result.events.append(
            ("KILLED", f"still running {grace:g}s after it was asked to stop; forced")
        )
    result.effects.append(Stop(RUN, deadline))


def _detected(result: Result, event: Detected, *_: Any) -> None:
    state = result.state
    state.job_identity, state.spec_digest = event.identity, event.digest
    state.submission = state.submission or event.submission
    _event(result, "PENDING", f"spec detected (job_id={event.job_id})")


def _spec_changed(result: Result, event: SpecChanged, *_: Any) -> None:
    result.state.spec_digest, result.state.job_identity = event.digest, event.identity
    _event(result, "UPDATED", f"{event.what} (while pending)")


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
        lambda r, e, now, *_: _complete(r, Outcome.REJECTED, e.reason, now),
        says="-> COMPLETED (REJECTED)",
    ),
    Row(Wait, _PENDING, _reason, says="reason only"),
    Row(Cancel, _PENDING, _cancel_pending, says="-> COMPLETED (CANCELLED)"),
    Row(Cancel, _ACTIVE, _cancel_active, says="-> CANCELLING, Stop(run)"),
    Row(Preempt, _ACTIVE, _preempt, lambda s, e: not s.stop, says="Stop(run), stop recorded"),
    Row(Update, _ACTIVE, _update, says="Stop(run), stop recorded"),
    Row(Started, None, _started, _unstarted, says="handle recorded"),
    Row(
        StartFailed,
        None,
        lambda r, e, now, job, c: _start_failed(r, e, now, c),
        says="-> COMPLETED, Log(failed), Delete(run)",
    ),
    Row(
        StartDeferred,
        None,
        lambda r, e, now, job, c: _start_deferred(r, e, now, c),
        lambda s, e: bool(attempt_record(s, e.purpose)),
        says="reason; or gives up",
    ),
    Row(
        Observed,
        None,
        lambda r, e, now, job, c: _observed(r, e, now, c),
        says="phase, health; at the end -> PENDING, CLEANING or COMPLETED",
    ),
    Row(
        CleanupAdmit,
        _only(Status.CLEANING),
        _cleanup_admit,
        lambda s, e: not s.cleanup_runner,
        says="Start(cleanup)",
    ),
    Row(
        Tick,
        None,
        _tick_cancelled,
        lambda s, e: _cancelled_before_start(s),
        says="-> COMPLETED (CANCELLED)",
    ),
    Row(
        Tick,
        None,
        _tick_stopping,
        lambda s, e: bool(s.stop and s.runner),
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
    for row in ROWS:
        fits = row.statuses is None or state.status in row.statuses
        if isinstance(event, row.event) and fits and row.when(state, event):
            return row
    return None


def transition(
    state: JobState, event: Event, now: float, *, job: str = "", has_cleanup: bool = False
) -> Result:
    """The next state and the effects to carry out; ``state`` itself is not modified. The
    history lines the move produced are in the new state (and in ``Result.events`` /
    ``Result.notes`` for the daemon's log)."""
    row = row_for(state, event)
    if row is None:
        return Result(state)
    new = dataclasses.replace(state, events=list(state.events))
    result = Result(new)
    row.then(result, event, now, job, has_cleanup)
    for name, reason in result.events:  # an event's reason is the job's reason from now on
        new.reason = reason
        _history(new, now, name, reason)
    for name, text, attempt in result.notes:
        _history(new, now, name, text, attempt)
    return result


def _history(state: JobState, now: float, event: str, text: str, attempt: int | None = None):
    state.add_event(
        {
            "time": now,
            "event": event,
            "status": state.status.value,
            "attempt": attempt or state.attempt,
            "reason": text,
        }
    )


def _event(result: Result, event: str, reason: str) -> None:
    result.state.reason = reason
    result.events.append((event, reason))


def _set_record(state: JobState, purpose: str, record: dict[str, Any] | None) -> None:
    if purpose == RUN:
        state.runner = record
    else:
        state.cleanup_runner = record


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
    state.runner = {
        "kind": event.runner_kind,
        "name": event.attempt_name,
        "handle": None,
        "origin": event.log_size + len(marker.encode()),
        "phase": "STARTING",
    }
    result.effects += [Log(RUN, marker), Start(RUN)]
    _event(result, "STARTED", f"attempt {state.attempt} started: {event.reason}")


def _stop(
    result: Result,
    kind: StopKind,
    reason: str,
    now: float,
    by: str | None,
    grace: float,
    force: bool = False,
) -> None:
    state = result.state
    if state.stop and state.stop["kind"] == StopKind.CANCEL.value:
        return  # a cancel already in progress wins
    if state.stop and not force:
        return
    since = state.stop["since"] if state.stop else now
    deadline = state.stop["deadline"] if state.stop else now + grace
    state.stop = {
        "kind": kind.value,
        "since": since,
        "by": by,
        "deadline": deadline,
        "reason": reason,
    }
    if state.runner:
        result.effects.append(Stop(RUN, deadline))
    _event(result, kind.value.upper(), reason)


def _delete(result: Result, purpose: str, record: dict[str, Any]) -> None:
    result.effects.append(
        Delete(purpose, str(record["kind"]), str(record["name"]), record.get("handle"))
    )


def _start_failed(result: Result, event: StartFailed, now: float, has_cleanup: bool) -> None:
    state = result.state
    record = attempt_record(state, event.purpose)
    if record is None:
        return
    _set_record(state, event.purpose, None)
    _delete(result, event.purpose, record)
    if event.purpose == CLEANUP:
        note = f"{state.reason}; the cleanup command could not start: {event.error}"
        _complete(result, state.outcome or Outcome.FAILED, note, now)
        return
    result.effects.append(
        Log(RUN, f"=== [bastion] attempt {state.attempt} could not start: {event.error} ===\n")
    )
    stop, state.stop = state.stop, None
    if stop and stop["kind"] == StopKind.CANCEL.value:  # cancelled before it could start
        _complete(result, Outcome.CANCELLED, stop.get("reason", ""), now)
        return
    _complete(result, Outcome.FAILED, f"could not start the command: {event.error}", now)


def _cancelled_before_start(state: JobState) -> bool:
    record = state.runner
    return bool(
        state.stop
        and state.stop["kind"] == StopKind.CANCEL.value
        and record
        and record.get("handle") is None
        and record.get("deferred_since") is not None
    )


def _start_deferred(result: Result, event: StartDeferred, now: float, has_cleanup: bool) -> None:
    state = result.state
    record = attempt_record(state, event.purpose)
    if record is None or record.get("handle") is not None:
        return
    stop = state.stop
    if event.purpose == RUN and stop and stop["kind"] == StopKind.CANCEL.value:
        _start_failed(result, StartFailed(event.purpose, event.reason), now, has_cleanup)
        return
    since = float(record.get("deferred_since") or now)
    bound = event.give_up_after
    if bound is not None and now - since >= bound:
        error = (
            f"{event.reason} (still failing after {now - since:.0f}s of tries; gave up: the "
            f"daemon's start_give_up_seconds is {bound:g})"
        )
        _start_failed(result, StartFailed(event.purpose, error), now, has_cleanup)
        return
    if record.get("deferred_since") is None:
        _set_record(state, event.purpose, {**record, "deferred_since": now})
    until = f"; gives up at {fmt_time(since + bound)}" if bound is not None else ""
    state.reason = f"attempt {state.attempt} waits to start: {event.reason}{until}"


def _end_marker(state: JobState, obs: Observation, now: float) -> str:
    if obs.phase is AttemptPhase.PREEMPTED:
        how = f"was preempted by the provider ({obs.reason})"
    elif obs.phase is AttemptPhase.LOST:
        how = f"was lost ({obs.reason})"
    elif obs.exit_code is not None:
        how = f"exited with status {obs.exit_code}"
    else:
        how = f"ended: {obs.reason or 'was killed'}"
    stop = state.stop
    why = f"; it was stopped ({stop['kind']}: {stop.get('reason', '')})" if stop else ""
    return f"=== [bastion] attempt {state.attempt} {how} at {fmt_time(now)}{why} ===\n"


def _observed(result: Result, event: Observed, now: float, has_cleanup: bool) -> None:
    state = result.state
    obs = event.observation
    record = attempt_record(state, event.purpose)
    if record is None:
        return
    if obs.checkpoint is not None and obs.checkpoint > (state.last_checkpoint or 0.0):
        state.last_checkpoint = obs.checkpoint  # the job's progress report (policy: lost work)
    if not obs.finished:
        if obs.workers and record.get("workers") != list(obs.workers):
            # Each worker's health ("running", "late", "exit 1"...), for list; stable words,
            # so the state is rewritten only when a worker's health changes.
            record = {**record, "workers": list(obs.workers)}
            _set_record(state, event.purpose, record)
        if record.get("phase") != obs.phase.value:
            _set_record(state, event.purpose, {**record, "phase": obs.phase.value})
            if event.purpose == RUN and obs.phase is AttemptPhase.RUNNING:
                state.running_since = now
        if event.purpose == RUN:
            _follow_runner(state, obs)
        return
    _set_record(state, event.purpose, None)
    _delete(result, event.purpose, record)
    if "backfill_for" in state.metadata:  # a backfill mark lasts as long as its attempt
        state.metadata = {k: v for k, v in state.metadata.items() if k != "backfill_for"}
    if event.purpose == CLEANUP:
        note = "" if obs.exit_code == 0 else f" (cleanup {obs.reason or 'failed'})"
        reason = state.reason.removesuffix(_CLEANING_NOTE)
        _complete(result, state.outcome or Outcome.FAILED, f"{reason}{note}", now)
        return
    result.effects.append(Log(RUN, _end_marker(state, obs, now)))
    stop = state.stop
    forced = obs.exit_code in (None, 137)  # SIGKILL's status, or none (the wrapper died too)
    if stop and forced and not stop.get("forced") and now >= float(stop["deadline"]):
        # The runner forced it at the deadline before a tick could say so.
        grace = float(stop["deadline"]) - float(stop["since"])
        result.events.append(
            ("KILLED", f"still running {grace:g}s after it was asked to stop; forced")
        )
    state.exit_code = obs.exit_code
    state.end_time = now
    stop, state.stop = state.stop, None
    if stop and stop["kind"] == StopKind.CANCEL.value:
        _finish_run(result, Outcome.CANCELLED, stop.get("reason", ""), now, has_cleanup)
    elif stop:
        what = "preempted" if stop["kind"] == StopKind.PREEMPT.value else "updated"
        _requeue(result, f"attempt {state.attempt} {what}; waiting to restart")
    elif obs.phase is AttemptPhase.PREEMPTED:
        state.provider_preemptions += 1
        _requeue(
            result,
            f"attempt {state.attempt} preempted by the provider ({obs.reason}); "
            f"requeued as attempt {state.attempt + 1}",
            event="PROVIDER_PREEMPTED",
        )
    elif obs.phase is AttemptPhase.LOST:
        _requeue(
            result,
            f"attempt {state.attempt} lost ({obs.reason}); requeued as attempt {state.attempt + 1}",
            event="LOST",
        )
    elif obs.phase is AttemptPhase.SUCCEEDED:
        _finish_run(result, Outcome.SUCCEEDED, "command exited with status 0", now, has_cleanup)
    elif obs.retryable and obs.exit_code is None:
        # The provider could not give us the machines (a stockout, a queued resource past its
        # deadline): not the job's failure, and a new attempt may get them elsewhere.
        _requeue(
            result,
            f"attempt {state.attempt} could not be provisioned ({obs.reason}); "
            f"requeued as attempt {state.attempt + 1}",
            event="PROVISIONING_FAILED",
        )
    elif obs.exit_code is None and obs.reason:
        # No status to report: the runner says what ended it (a request the cloud refused, a
        # VM its dead man's switch deleted); "the command was killed" would mislead.
        _finish_run(
            result,
            Outcome.FAILED,
            f"attempt {state.attempt} failed: {obs.reason}",
            now,
            has_cleanup,
        )
    else:
        how = f"exited with status {obs.exit_code}" if obs.exit_code is not None else "was killed"
        said = obs.reason if obs.reason and obs.reason != how else ""  # e.g. which worker
        reason = f"command {how}" + (f" ({said})" if said else "")
        _finish_run(result, Outcome.FAILED, reason, now, has_cleanup)


def _follow_runner(state: JobState, obs: Observation) -> None:
    """The reason follows what the runner says now, not what it said first: while the
    attempt waits (queued, provisioning) and, once the runner's words are the reason, while it
    runs ("provisioning: node CREATING" must not outlive the node's creation: "running:
    waiting for workers to start (0 of 1)", then "running: 1 of 1 workers running"). A
    runner's words are stable between changes, so the state is rewritten only on a change.
    A runner that goes straight to running keeps the admission's reason, as before, and a
    stop in progress keeps its own (why it is being stopped)."""
    prefix = f"attempt {state.attempt}: "
    if state.stop or (obs.phase is AttemptPhase.RUNNING and not state.reason.startswith(prefix)):
        return
    reason = f"{prefix}{obs.phase.value.lower()}" + (f": {obs.reason}" if obs.reason else "")
    if state.reason != reason:
        state.reason = reason


def _requeue(result: Result, reason: str, event: str = "REQUEUED") -> None:
    state = result.state
    state.status = Status.PENDING
    state.tier = None
    state.running_since = None
    state.pending_since = state.end_time  # the attempt's end: when it began to wait again
    _event(result, event, reason)


def _finish_run(
    result: Result, outcome: Outcome, reason: str, now: float, has_cleanup: bool
) -> None:
    state = result.state
    if not has_cleanup:
        _complete(result, outcome, reason, now)
        return
    state.outcome = outcome
    state.status = Status.CLEANING
    _event(result, "CLEANING", f"{reason}{_CLEANING_NOTE}")
    result.effects.append(NeedsCleanup())


def _complete(result: Result, outcome: Outcome, reason: str, now: float) -> None:
    state = result.state
    state.status = Status.COMPLETED
    state.outcome = outcome
    state.end_time = state.end_time or now
    state.stop = None
    state.running_since = None
    _event(result, outcome.value, reason)
