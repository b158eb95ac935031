"""How the lifecycle table takes in what a runner says about an attempt: a start that
failed or must wait, progress while it runs, and where the job goes when it ends (requeued,
finished, timed out). Pure, like the table (:mod:`bastion.lifecycle`)."""

from __future__ import annotations

from bastion.jobstate import AttemptRecord, JobState, Outcome, StopKind, StopRecord
from bastion.lifecycle_records import (
    CLEANING_NOTE,
    CLEANUP,
    NOT_STARTED,
    RUN,
    Log,
    Result,
    attempt_record,
    complete,
    delete_attempt,
    finish_run,
    fmt_time,
    requeue,
    set_record,
)
from bastion.runners.base import AttemptPhase, Observation


def start_failed(result: Result, purpose: str, error: str, now: float, has_cleanup: bool) -> None:
    """The attempt could not start (the job's error, or a deferral given up): it ends
    FAILED, or CANCELLED when a cancel came first; a cleanup that cannot start keeps the
    run's outcome."""
    state = result.state
    record = attempt_record(state, purpose)
    if record is None:
        return
    set_record(state, purpose, None)
    delete_attempt(result, purpose, record)
    if purpose == CLEANUP:
        note = f"{state.reason}; the cleanup command could not start: {error}"
        complete(result, state.outcome or Outcome.FAILED, note, now)
        return
    result.effects.append(
        Log(RUN, f"=== [bastion] attempt {state.attempt} could not start: {error} ===\n")
    )
    stop, state.stop = state.stop, None
    if stop is not None and stop.is_cancel:  # cancelled before it could start
        complete(result, Outcome.CANCELLED, stop.reason, now)
        return
    complete(result, Outcome.FAILED, f"could not start the command: {error}", now)


def cancelled_before_start(state: JobState) -> bool:
    record = state.run_attempt
    return bool(
        state.stop is not None
        and state.stop.is_cancel
        and record is not None
        and record.unstarted
        and record.deferred_since is not None
    )


def start_deferred(
    result: Result,
    purpose: str,
    reason: str,
    give_up_after: float | None,
    now: float,
    has_cleanup: bool,
    requeue_on_give_up: bool = False,
) -> None:
    """A start to try again (see ``lifecycle.StartDeferred``), or given up past its bound:
    failed, or (``requeue_on_give_up``: the runner cannot start anything now) back to PENDING."""
    state = result.state
    record = attempt_record(state, purpose)
    if record is None or not record.unstarted:
        return
    stop = state.stop
    if purpose == RUN and stop is not None and stop.is_cancel:
        start_failed(result, purpose, reason, now, has_cleanup)
        return
    since = record.deferred_since or now
    bound = give_up_after
    if bound is not None and now - since >= bound and requeue_on_give_up and purpose == RUN:
        set_record(state, purpose, None)
        delete_attempt(result, purpose, record)
        note = f"{NOT_STARTED}: {reason} (tried for {now - since:.0f}s)"
        result.effects.append(Log(RUN, f"=== [bastion] attempt {state.attempt} {note} ===\n"))
        state.end_time = now
        again = f"; waiting, no quota held; tries again at {fmt_time(now + bound)}"
        requeue(result, note + again, event="NOT_STARTED")
        return
    if bound is not None and now - since >= bound:
        error = (
            f"{reason} (still failing after {now - since:.0f}s of tries; gave up: the "
            f"daemon's start_give_up_seconds is {bound:g})"
        )
        start_failed(result, purpose, error, now, has_cleanup)
        return
    if record.deferred_since is None:
        set_record(state, purpose, record.deferred(now))
    ends = "lets go of its quota" if requeue_on_give_up else "gives up"
    until = f"; {ends} at {fmt_time(since + bound)}" if bound is not None else ""
    state.reason = f"attempt {state.attempt} waits to start: {reason}{until}"


def end_marker(state: JobState, obs: Observation, now: float) -> str:
    if obs.phase is AttemptPhase.PREEMPTED:
        how = f"was preempted by the provider ({obs.reason})"
    elif obs.phase is AttemptPhase.LOST:
        how = f"was lost ({obs.reason})"
    elif obs.exit_code is not None:
        how = f"exited with status {obs.exit_code}"
    else:
        how = f"ended: {obs.reason or 'was killed'}"
    stop = state.stop
    why = f"; it was stopped ({stop.kind}: {stop.reason})" if stop is not None else ""
    return f"=== [bastion] attempt {state.attempt} {how} at {fmt_time(now)}{why} ===\n"


def observed(result: Result, purpose: str, obs: Observation, now: float, has_cleanup: bool) -> None:
    """A runner's observation of the attempt for ``purpose``: progress while it runs (phase,
    workers' health, the runner's words); at its end, where the job goes next."""
    state = result.state
    record = attempt_record(state, purpose)
    if record is None:
        return
    if obs.checkpoint is not None and obs.checkpoint > (state.last_checkpoint or 0.0):
        state.last_checkpoint = obs.checkpoint  # the job's progress report (policy: lost work)
    if not obs.finished:
        _progress(state, purpose, record, obs, now)
        return
    set_record(state, purpose, None)
    delete_attempt(result, purpose, record)
    if "backfill_for" in state.metadata:  # a backfill mark lasts as long as its attempt
        state.metadata = {k: v for k, v in state.metadata.items() if k != "backfill_for"}
    if purpose == CLEANUP:
        note = "" if obs.exit_code == 0 else f" (cleanup {obs.reason or 'failed'})"
        reason = state.reason.removesuffix(CLEANING_NOTE)
        complete(result, state.outcome or Outcome.FAILED, f"{reason}{note}", now)
        return
    result.effects.append(Log(RUN, end_marker(state, obs, now)))
    _note_forced(result, obs, now)
    if state.running_since is not None:  # what its time limit counts: running time only
        state.ran_seconds = float(state.ran_seconds or 0.0) + max(0.0, now - state.running_since)
    state.exit_code = obs.exit_code
    state.end_time = now
    stop, state.stop = state.stop, None
    if stop is not None:
        _stopped_run_ended(result, stop, now, has_cleanup)
    else:
        _run_ended(result, obs, now, has_cleanup)


def _progress(
    state: JobState, purpose: str, record: AttemptRecord, obs: Observation, now: float
) -> None:
    if obs.workers and record.workers != tuple(obs.workers):
        # Each worker's health ("running", "late", "exit 1"...), for list; stable words,
        # so the state is rewritten only when a worker's health changes.
        record = record.with_workers(tuple(obs.workers))
        set_record(state, purpose, record)
    if record.phase != obs.phase.value:
        set_record(state, purpose, record.with_phase(obs.phase.value))
        if purpose == RUN and obs.phase is AttemptPhase.RUNNING:
            state.running_since = now
    if purpose == RUN:
        follow_runner(state, obs)


def _note_forced(result: Result, obs: Observation, now: float) -> None:
    """The runner forced the attempt at the stop's deadline before a tick could say so."""
    stop = result.state.stop
    forced = obs.exit_code in (None, 137)  # SIGKILL's status, or none (the wrapper died too)
    if stop is not None and forced and not stop.forced and now >= stop.deadline:
        grace = stop.deadline - stop.since
        result.events.append(
            ("KILLED", f"still running {grace:g}s after it was asked to stop; forced")
        )


def _stopped_run_ended(result: Result, stop: StopRecord, now: float, has_cleanup: bool) -> None:
    """A run that Bastion stopped has ended: a cancel or its time limit ends the job;
    a preemption or an update requeues it."""
    state = result.state
    kind = stop.kind
    if kind == StopKind.CANCEL:
        finish_run(result, Outcome.CANCELLED, stop.reason, now, has_cleanup)
    elif kind == StopKind.TIMEOUT:
        finish_run(result, Outcome.TIMEOUT, stop.reason, now, has_cleanup)
    else:
        what = "preempted" if kind == StopKind.PREEMPT else "updated"
        requeue(result, f"attempt {state.attempt} {what}; waiting to restart")


def _run_ended(result: Result, obs: Observation, now: float, has_cleanup: bool) -> None:
    """A run ended on its own: requeued when the provider took it away, else finished."""
    state = result.state
    again = f"requeued as attempt {state.attempt + 1}"
    if obs.phase is AttemptPhase.PREEMPTED:
        state.provider_preemptions += 1
        text = f"attempt {state.attempt} preempted by the provider ({obs.reason}); {again}"
        requeue(result, text, event="PROVIDER_PREEMPTED")
    elif obs.phase is AttemptPhase.LOST:
        requeue(result, f"attempt {state.attempt} lost ({obs.reason}); {again}", event="LOST")
    elif obs.phase is AttemptPhase.SUCCEEDED:
        finish_run(result, Outcome.SUCCEEDED, "command exited with status 0", now, has_cleanup)
    elif obs.retryable and obs.exit_code is None:
        # The provider could not give us the machines (a stockout, a queued resource past its
        # deadline): not the job's failure, and a new attempt may get them elsewhere.
        text = f"attempt {state.attempt} could not be provisioned ({obs.reason}); {again}"
        requeue(result, text, event="PROVISIONING_FAILED")
    elif obs.exit_code is None and obs.reason:
        # No status to report: the runner says what ended it (a request the cloud refused, a
        # VM its dead man's switch deleted); "the command was killed" would mislead.
        text = f"attempt {state.attempt} failed: {obs.reason}"
        finish_run(result, Outcome.FAILED, text, now, has_cleanup)
    else:
        how = f"exited with status {obs.exit_code}" if obs.exit_code is not None else "was killed"
        said = obs.reason if obs.reason and obs.reason != how else ""  # e.g. which worker
        reason = f"command {how}" + (f" ({said})" if said else "")
        finish_run(result, Outcome.FAILED, reason, now, has_cleanup)


def follow_runner(state: JobState, obs: Observation) -> None:
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
