"""A job's lifecycle as one table: ``transition(state, event, now) -> (state, effects)``.

Pure: no I/O, no runner, no clock but ``now``. The daemon turns what it sees (the policy's
decisions, user requests, a runner's observations) into events, feeds them here, and executes
the effects it gets back (start, stop, delete an attempt; a line in the job's log) apart from
deciding them. Every legal move is in the table below; an event that has no row for the
job's status changes nothing.

    status      event                           -> status       effects
    PENDING     Admit(tier)                     -> ACTIVE       Log(start), Start(run)
    PENDING     Reject | Cancel                 -> COMPLETED    -
    PENDING     Wait(reason)                    -> PENDING      -   (reason only)
    ACTIVE      Started(handle)                 -> ACTIVE       -   (handle recorded)
    ACTIVE      StartFailed (the job's error)   -> COMPLETED    Log(failed), Delete(run)
    ACTIVE      StartDeferred (transient)       -> ACTIVE       -   (reason; the daemon retries)
    ACTIVE      Observed(queued|provisioning|running) -> ACTIVE -   (phase; running_since;
                                                                 each worker's health)
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

The attempt record (``state.runner`` / ``state.cleanup_runner``) is the daemon's own:
``{"kind", "name", "handle", "origin", "phase"}``; ``handle`` is the runner's and opaque here.
It is written to the bucket *before* the attempt is started (the daemon writes states before
it executes effects), so a daemon that dies at any point finds the attempt by its name.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from bastion.jobspec import user_label
from bastion.jobstate import JobState, Outcome, Status, StopKind
from bastion.runners.base import Handle, Observation, Phase

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
    unreachable engine); the daemon tries again next cycle. Only the reason changes."""

    purpose: str
    reason: str


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


Event = Admit | Reject | Wait | Preempt | Update | Cancel | Started | StartFailed | Observed | Tick


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


def fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


def start_marker(name: str, attempt: int, tier: int | None, now: float) -> str:
    return (
        f"=== [bastion] attempt {attempt} of {name} started at {fmt_time(now)} (tier {tier}) ===\n"
    )


def attempt_record(state: JobState, purpose: str) -> dict[str, Any] | None:
    return state.runner if purpose == RUN else state.cleanup_runner


# -- the table -------------------------------------------------------------------------------


def transition(
    state: JobState, event: Event, now: float, *, job: str = "", has_cleanup: bool = False
) -> Result:
    """The next state and the effects to carry out; ``state`` itself is not modified."""
    new = dataclasses.replace(state, events=list(state.events))
    result = Result(new)
    status = new.status
    if isinstance(event, Admit) and status is Status.PENDING:
        _admit(result, event, job, now)
    elif isinstance(event, Reject) and status is Status.PENDING:
        _complete(result, Outcome.REJECTED, event.reason, now)
    elif isinstance(event, Wait) and status is Status.PENDING:
        new.reason = event.reason
    elif isinstance(event, Cancel):
        if status is Status.PENDING:
            _complete(result, Outcome.CANCELLED, event.reason, now)
        elif status is Status.ACTIVE:
            new.status = Status.CANCELLING
            _stop(result, StopKind.CANCEL, event.reason, now, None, event.grace, force=True)
    elif isinstance(event, Preempt) and status is Status.ACTIVE and not new.stop:
        new.preemptions += 1
        _stop(result, StopKind.PREEMPT, event.reason, now, event.by, event.grace)
    elif isinstance(event, Update) and status is Status.ACTIVE:
        _stop(result, StopKind.UPDATE, event.reason, now, None, event.grace)
    elif isinstance(event, Started):
        record = attempt_record(new, event.purpose)
        if record is not None and record.get("handle") is None:
            _set_record(new, event.purpose, {**record, "handle": event.handle})
    elif isinstance(event, StartFailed):
        _start_failed(result, event, now, has_cleanup)
    elif isinstance(event, StartDeferred) and attempt_record(new, event.purpose):
        new.reason = f"attempt {new.attempt} waits to start: {event.reason}"
    elif isinstance(event, Observed):
        _observed(result, event, now, has_cleanup)
    elif isinstance(event, CleanupAdmit) and status is Status.CLEANING and not new.cleanup_runner:
        new.cleanup_runner = {
            "kind": event.runner_kind,
            "name": event.attempt_name,
            "handle": None,
            "origin": event.log_size,
            "phase": "STARTING",
        }
        result.effects.append(Start(CLEANUP))
    elif isinstance(event, Tick) and new.stop and new.runner:
        deadline = float(new.stop["deadline"])
        if now >= deadline and not new.stop.get("forced"):
            new.stop = {**new.stop, "forced": True}
            grace = deadline - float(new.stop["since"])
            result.events.append(
                ("KILLED", f"still running {grace:g}s after it was asked to stop; forced")
            )
        result.effects.append(Stop(RUN, deadline))
    return result


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


def _end_marker(state: JobState, obs: Observation, now: float) -> str:
    if obs.phase is Phase.PREEMPTED:
        how = f"was preempted by the provider ({obs.reason})"
    elif obs.phase is Phase.LOST:
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
    if not obs.finished:
        if obs.workers and record.get("workers") != list(obs.workers):
            # Each worker's health ("running", "late", "exit 1"...), for list; stable words,
            # so the state is rewritten only when a worker's health changes.
            record = {**record, "workers": list(obs.workers)}
            _set_record(state, event.purpose, record)
        waiting = f"attempt {state.attempt}: {obs.phase.value.lower()}" + (
            f": {obs.reason}" if obs.reason else ""
        )
        if record.get("phase") != obs.phase.value:
            _set_record(state, event.purpose, {**record, "phase": obs.phase.value})
            if event.purpose == RUN and obs.phase is Phase.RUNNING:
                state.running_since = now
            if event.purpose == RUN and obs.phase is not Phase.RUNNING:
                state.reason = waiting
        elif (event.purpose == RUN and obs.phase in (Phase.QUEUED, Phase.PROVISIONING)
              and state.reason != waiting):  # fmt: skip
            # Progress while waiting ("3 of 32 pods scheduled", a queue's name): shown by
            # list; rewritten only when the runner's words change, never per cycle.
            state.reason = waiting
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
    elif obs.phase is Phase.PREEMPTED:
        state.provider_preemptions += 1
        _requeue(
            result,
            f"attempt {state.attempt} preempted by the provider ({obs.reason}); "
            f"requeued as attempt {state.attempt + 1}",
            event="PROVIDER_PREEMPTED",
        )
    elif obs.phase is Phase.LOST:
        _requeue(
            result,
            f"attempt {state.attempt} lost ({obs.reason}); requeued as attempt {state.attempt + 1}",
            event="LOST",
        )
    elif obs.phase is Phase.SUCCEEDED:
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
        _finish_run(result, Outcome.FAILED, f"attempt {state.attempt} failed: {obs.reason}",
                    now, has_cleanup)  # fmt: skip
    else:
        how = f"exited with status {obs.exit_code}" if obs.exit_code is not None else "was killed"
        said = obs.reason if obs.reason and obs.reason != how else ""  # e.g. which worker
        reason = f"command {how}" + (f" ({said})" if said else "")
        _finish_run(result, Outcome.FAILED, reason, now, has_cleanup)


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
