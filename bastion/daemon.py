"""The daemon: one cycle lists the bucket, reads what changed, decides, writes, then acts.

Decide, then act. A cycle turns what it sees (spec changes, user requests, runners'
observations, the policy's decisions) into events for the lifecycle table
(:mod:`bastion.lifecycle`), which returns the job's next state and the effects to carry out.
The states are written to the bucket first; only then are the effects (start, stop, delete an
attempt) handed to the effects pool, so every attempt is recorded in the bucket, by name, before
it exists, and a daemon that dies at any moment finds it again. The scheduling loop never waits
on a runner: effects finish in their pool (apart from the pool of the cycle's own requests, so
a burst's starts never hold up the next cycle) and their results are taken in next cycle.

Fencing: every effect first checks that the lease is certainly ours for longer than the effect
can take (see :mod:`bastion.lease`); a daemon that cannot prove it starts nothing and drops
what it knows.

A cycle is cheap when nothing changed: it lists jobs/user_states/ (cancel requests and the
submission markers that name new or replaced specs) and every spec only now and then
(:mod:`bastion.specwatch`); a spec is re-read only when its token changes, states are written
only when their bytes change, and logs upload only new bytes. Every per-job step is wrapped
so one bad input or one failed call is recorded on that job and never stops the cycle for the
others.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bastion import lifecycle
from bastion.jobspec import JobSpec, SpecError, name_problem, requester, spec_changes
from bastion.jobstate import JobState, Status
from bastion.lease import Lease
from bastion.lifecycle import CLEANUP, RUN
from bastion.logsync import LogSync
from bastion.objects import ObjectInfo, PreconditionFailed, UnacceptableObject
from bastion.quotas import QuotaSource
from bastion.runners.base import (
    Attempt,
    Fenced,
    NoCapacity,
    Observation,
    Phase,
    RunnerError,
    Runners,
    attempt_name,
    attempt_number,
)
from bastion.scheduling import job_request, policy_requests
from bastion.specwatch import Look, SpecWatch
from bastion.store import Store
from quota.model import JobRequest, Plan
from quota.policy import Decision, Verdict, replan_by, schedule

log = logging.getLogger("bastion.daemon")

DEFAULT_GRACE_SECONDS = 30.0
# A start that keeps failing transiently (TryAgain, an unexpected error) is tried again next
# cycle, then after 1, 2, 4 ... seconds up to START_RETRY_MAX_SECONDS apart, per job, and given
# up (the job FAILS with the last reason, its quota free) this long after its first failure.
# A wait for cloud capacity (NoCapacity) has no such bound. Setting: start_give_up_seconds.
DEFAULT_START_GIVE_UP_SECONDS = 600.0
START_RETRY_FIRST_SECONDS = 1.0
START_RETRY_MAX_SECONDS = 60.0
DECISION_RECORDS_KEPT = 1000
DECISION_RECORD_BYTES = 8 << 10  # one record's decisions; the rest of a burst is counted
OUTPUT_CHUNK = 8 << 20  # bytes of one attempt's output copied per read
REPLAN_SECONDS = 30.0  # a quiet queue's pass runs at least this often (decayed usage moves)
QUEUE_NAMES_KEPT = 1000  # per project in the queue summary: its size stays bounded
QUEUE_REASONS_KEPT = 50  # full (volatile) wait reasons per project in the queue summary
_PART_OF_ATTEMPT = re.compile(r"-s?\d+$")  # an attempt name ends -a<N>[c]: never matched
SWEEP_EVERY_CYCLES = 20  # orphaned attempts are looked for this often (and at recovery)
# A finished job is recorded once its attempts are verified gone (so its history says so),
# or after this long: the deletion goes on (and the sweep finds what a restart forgot).
DELETE_WAIT_SECONDS = 300.0
MAX_SPEC_ENV_BYTES = 64 << 10  # the spec rides in an environment variable only below this
# Checkpoints uploaded at most this often (and when the daemon stops), not in every cycle that
# changed something: each costs a request in the cycle where one job finishes.
DAEMON_LOG_SYNC_SECONDS = 10.0  # the daemon's own log (diagnostics) in the bucket
USAGE_SAVE_SECONDS = 60.0  # the usage ledger: a crash loses at most this much of its accrual


@dataclass
class Job:
    """What the daemon holds in memory about one job between cycles."""

    name: str
    state: JobState
    spec: JobSpec | None = None
    token: str = ""  # listing token of the spec we last read
    written: bytes = b""  # state bytes as last written to (or read from) the bucket
    state_token: str | None = None  # token of the state object we wrote/read; None: absent
    attempted: list[bytes] = field(default_factory=list)  # writes not yet confirmed
    gone_from_bucket: bool = False
    effects: list[lifecycle.Effect] = field(default_factory=list)  # decided, not yet carried out
    inflight: int = 0  # effects handed to the pool whose results are not taken in yet
    pending_log: list[tuple[str, str]] = field(default_factory=list)  # lines a full disk refused
    spec_json: tuple[JobSpec | None, str] = (None, "")  # the spec, serialized for its env
    reason_before_blind: str | None = None  # the reason before its attempt could not be watched

    def unwritten(self) -> bool:
        """True when the state differs from what the bucket holds. Only a state marked changed
        since its last write is serialized to find out: a quiet cycle serializes nothing."""
        if not self.state.changed:
            return False
        if self.state.dumps() != self.written:
            return True
        self.state.mark_written()
        return False


@dataclass
class CycleReport:
    started: float
    seconds: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step of the cycle
    planned: bool = False  # the policy pass ran (a quiet cycle keeps the last plan)

    def slowest(self, count: int = 3) -> str:
        top = sorted(self.phases.items(), key=lambda kv: -kv[1])[:count]
        return ", ".join(f"{name} {seconds:.2f}s" for name, seconds in top)


def _quietly(call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """For pool.map: return the exception instead of raising it, so one failure stays local."""

    def wrapped(arg: Any) -> Any:
        try:
            return call(arg)
        except Exception as e:
            return e

    return wrapped


def _seen_by_policy(job: Job, state: JobState, now: float) -> JobRequest | None:
    """What a pass would see of the job, less when its minimum runtime started counting: a
    running job's start moving later (provisioning, then running) only delays when it becomes
    preemptible, and the last plan's replan time (quota.policy.replan_by) is already earlier."""
    request = job_request(job.name, job.spec, state, now)
    return None if request is None else dataclasses.replace(request, start_time=None)


def _retrying(call: Callable[[Any], Any], attempts: int = 4) -> Callable[[Any], Any]:
    """For reads that must all succeed (recovery): a few quick retries, then raise."""

    def wrapped(arg: Any) -> Any:
        for attempt in range(attempts):
            try:
                return call(arg)
            except Exception:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.05 * 2**attempt)
        return None

    return wrapped


def _started_pool(workers: int, name: str) -> concurrent.futures.ThreadPoolExecutor:
    """A pool whose threads all exist already. An executor starts a thread per submission
    while it has fewer than ``workers``, and each start waits for the new thread to get the
    GIL: handing a burst's starts to a fresh pool, whose first threads were already forking
    processes, took 0.5 s of the admitting cycle (48 thread starts behind busy threads). Made
    while nothing of its own runs yet, the threads start in a few milliseconds."""
    pool = concurrent.futures.ThreadPoolExecutor(workers, name)
    gate = threading.Barrier(workers + 1)
    for _ in range(workers):  # each blocks a thread until all are made: none is reused
        pool.submit(gate.wait, 30)
    gate.wait(30)
    return pool


def _run_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


class NotHolding(Exception):
    """The lease is not certainly ours: nothing may be started or stopped."""


class Daemon:
    def __init__(
        self,
        store: Store,
        runners: Runners,
        work_dir: str,
        quota: QuotaSource,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        max_workers: int = 48,
        lease: Lease | None = None,
        start_give_up_seconds: float = DEFAULT_START_GIVE_UP_SECONDS,
    ) -> None:
        self.store = store
        self.start_give_up_seconds = start_give_up_seconds
        # (job, purpose) -> (failed tries, when the next is due) of starts that failed
        # transiently: each job backs off on its own (bastion/lifecycle.py gives up).
        self._start_retries: dict[tuple[str, str], tuple[int, float]] = {}
        self.lease = lease
        self.runners = runners
        self.quota = quota
        self.grace_seconds = grace_seconds
        self.logs = LogSync(store, os.path.join(work_dir, "logs"))
        self.daemon_log = Store.daemon_log_name(socket.gethostname(), os.path.abspath(work_dir))
        self.jobs: dict[str, Job] = {}
        self.specwatch = SpecWatch(store)  # which specs each cycle reads (markers, listing)
        self._daemon_log_synced_at = -DAEMON_LOG_SYNC_SECONDS  # the first sync is at once
        self._usage_saved_at = -USAGE_SAVE_SECONDS
        self._usage_unsaved = False
        self.cycles = 0
        self._decision_records = 0
        # Two pools: the cycle's own requests (spec reads, watches, write-backs) must not queue
        # behind the effects handed off by the last cycle (a burst's 1,000 starts kept the next
        # cycle's watches waiting 2 s), and effects must not wait for a cycle's requests.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, "bastion-io")
        self._effects_pool: concurrent.futures.ThreadPoolExecutor | None = None  # at first use
        self._workers = max_workers
        # Effect results to take in: an event, or None (the batch is done).
        self._done: list[tuple[str, lifecycle.Event | None]] = []
        self._done_lock = threading.Lock()
        self._deleting: dict[str, tuple[str, dict[str, Any] | None]] = {}  # name -> kind, handle
        self._deletes_in_pool: set[str] = set()  # handed to the pool, results not taken in
        # attempt name -> (its job, since when): the job is finalized once it is gone
        self._deletes_of: dict[str, tuple[str, float]] = {}
        self._deleted: list[tuple[str, str, dict[str, Any] | None]] = []  # verified gone
        self._undeleted: list[tuple[str, str, dict[str, Any] | None]] = []  # from the pool
        self._futures: set[concurrent.futures.Future[None]] = set()  # effects in flight
        self._stop = threading.Event()
        self._lost_ownership = False
        self._recovered = False
        self.info: dict[str, Any] = {}  # published to ROOT/history/daemon when we start acting
        self._queue_written = ""  # the queue summary last written (without its time)
        # The policy pass runs when a job changed, the quota file did, or a time threshold of
        # the last plan passed (quota.policy.replan_by); a quiet cycle skips it.
        self._inputs_changed = True
        self._planned_config: Any = None
        self._replan_at = 0.0

    # -- the loop --------------------------------------------------------------------------

    def run(self, poll_seconds: float, once: bool = False) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                if self.lease is None or self.lease.hold():
                    self._run_cycle(poll_seconds)
                else:
                    self._forget()
                    self._sync_daemon_log()
                if once:
                    break
                self._stop.wait(max(0.0, poll_seconds - (time.monotonic() - started)))
        finally:
            log.info("stopping; running jobs keep running and are adopted by the next daemon")
            self.settle()
            if self.lease is None or self.lease.held:
                with contextlib.suppress(Exception):
                    self._write_back()  # what the last effects changed (handles), then let go
                with contextlib.suppress(Exception):
                    self._save_usage(force=True)
            if self.lease is not None:
                self.lease.release()
            self._sync_daemon_log(force=True)

    def close(self) -> None:
        """After the last ``run``: the pools and the runners' clients (and the lease, for a
        daemon driven by ``cycle`` alone)."""
        if self.lease is not None:
            self.lease.release()
        self.settle()
        if self._effects_pool is not None:
            self._effects_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        self.runners.close()

    def _run_cycle(self, poll_seconds: float) -> None:
        try:
            report = self.cycle(time.time())
            if report.seconds > poll_seconds:
                log.warning(
                    "cycle took %.2fs, longer than --poll_seconds=%s (slowest: %s)",
                    report.seconds,
                    poll_seconds,
                    report.slowest(),
                )
        except NotHolding:
            log.error("the lease is not certainly ours; acting no more")
            self._lost_ownership = True
        except Exception:  # a failed listing (bucket outage): log it and try again
            log.exception("cycle %d failed; retrying in %ss", self.cycles, poll_seconds)
        if self._lost_ownership:
            log.error("another daemon may act on this root; stopping")
            if self.lease is not None:
                self.lease.release()
            self._forget()

    def _forget(self) -> None:
        """Drop what we know; if we act again it starts with a full recovery from the bucket."""
        if self.jobs or self._recovered:
            log.info("not acting on %s; forgetting in-memory state", self.store.root_url)
        self.jobs.clear()
        self._start_retries.clear()
        self._deleting.clear()
        self._deletes_in_pool.clear()
        self._deletes_of.clear()
        with self._done_lock:
            self._done.clear()
            self._undeleted.clear()
        self.cycles = 0
        self._recovered = False
        self._lost_ownership = False
        self._queue_written = ""
        self._inputs_changed = True
        self.specwatch.forget()

    def settle(self, timeout: float = 60.0) -> None:
        """Wait for the effects in flight and take in their results (tests, shutdown)."""
        concurrent.futures.wait(list(self._futures), timeout=timeout)
        self._take_in_results()

    def _may_act(self) -> None:
        """Before every effect. The lease's validity already ends a margin (a quarter of its
        term) before a standby may take over; that margin bounds one effect's duration (and
        the runners' fencing token covers an effect that outlasts it)."""
        if self._lost_ownership or (self.lease is not None and not self.lease.valid()):
            raise NotHolding

    def cycle(self, now: float) -> CycleReport:
        ops_before = dict(self.store.ops)
        report = CycleReport(started=now)
        mark = time.perf_counter()

        def done(phase: str) -> None:
            nonlocal mark
            report.phases[phase] = time.perf_counter() - mark
            mark = time.perf_counter()

        look = self.specwatch.look(now, full=not self._recovered)
        done("list")
        if not self._recovered:
            assert look.specs is not None  # the first look lists every spec
            self._recover(look.specs)  # raises if any state is unreadable: retried next cycle
            self._recovered = True
            done("recover")
        self.cycles += 1
        for runner in self.runners.made():
            runner.begin_cycle()
        self._take_in_results()
        self.quota.refresh()
        done("quota")
        self._read_specs(look, now)
        done("read_specs")
        self._apply_requests(look.requests, now)
        done("requests")
        self._observe(now)
        done("observe")
        report.planned = self._schedule(now)
        done("schedule")
        self._write_back()
        done("write_back")
        self._carry_out(now)
        done("effects")
        if self.cycles % SWEEP_EVERY_CYCLES == 0:
            self._sweep()
            self._check_states()
            done("upkeep")
        self._finalize_all(now)
        done("finalize")
        consumed = self.specwatch.hand_off()  # submission markers taken in: deleted at leisure
        if consumed:
            self._submit(self.specwatch.delete, consumed)
        self._sync_daemon_log()
        done("daemon_log")
        report.seconds = time.time() - now
        report.ops = {
            k: v - ops_before.get(k, 0)
            for k, v in self.store.ops.items()
            if v - ops_before.get(k, 0)
        }
        return report

    def _each(self, step: Callable[[Job, float], None], now: float) -> None:
        """Run a per-job step; a failure is recorded on that job and the cycle goes on."""
        for job in list(self.jobs.values()):
            try:
                step(job, now)
            except NotHolding:
                raise
            except Exception as e:
                log.exception("%s: %s failed; retrying next cycle", job.name, step.__name__)
                if job.state.status is not Status.COMPLETED:  # keep the outcome's reason
                    job.state.reason = f"internal error in {step.__name__.strip('_')}: {e}"

    # -- the lifecycle table -----------------------------------------------------------------

    def _apply(self, job: Job, event: lifecycle.Event, now: float) -> None:
        """Feed one event to the table; keep its effects (log lines are written at once:
        they are local appends that later offsets depend on)."""
        has_cleanup = bool(job.spec and job.spec.cleanup_command)
        result = lifecycle.transition(job.state, event, now, job=job.name, has_cleanup=has_cleanup)
        if not result.effects and not result.events and result.state == job.state:
            return  # nothing changed: the state stays unmarked (a quiet cycle writes nothing)
        if not self._inputs_changed and _seen_by_policy(job, job.state, now) != _seen_by_policy(
            job, result.state, now
        ):
            self._inputs_changed = True  # what the policy sees of this job moved: plan again
        job.state = result.state
        for name, reason in result.events:
            self._event(job, name, reason)
        for effect in result.effects:
            if isinstance(effect, lifecycle.Log):
                self._log_line(job, effect.purpose, effect.text)
            elif isinstance(effect, lifecycle.NeedsCleanup):
                log_name = Store.log_name(job.name, cleanup=True)
                self._apply(
                    job,
                    lifecycle.CleanupAdmit(
                        attempt_name=self._attempt_name(job, CLEANUP),
                        runner_kind=self._runner_kind(job),
                        log_size=self.logs.total(log_name),
                    ),
                    now,
                )
            elif isinstance(effect, lifecycle.Delete):
                self._deleting[effect.name] = (effect.kind, effect.handle)
                if effect.handle is not None:  # the job is recorded once this is gone
                    self._deletes_of.setdefault(effect.name, (job.name, time.time()))
            else:
                job.effects.append(effect)

    def _log_line(self, job: Job, purpose: str, text: str) -> None:
        log_name = Store.log_name(job.name, cleanup=purpose == CLEANUP)
        job.pending_log.append((log_name, text))
        try:
            while job.pending_log:
                self.logs.write(*job.pending_log[0])
                job.pending_log.pop(0)
        except OSError as e:  # a full work-dir disk: the line waits, the job goes on
            log.error("%s: could not write to the local log mirror (retrying): %s", job.name, e)

    def _event(self, job: Job, event: str, reason: str) -> None:
        """Record a lifecycle event in the job's state: written with it, at no extra cost."""
        job.state.reason = reason
        self._note(job, event, reason)

    def _note(self, job: Job, event: str, text: str, attempt: int | None = None) -> None:
        """A history line that leaves the job's reason as it is (where its attempt runs);
        ``attempt``: the attempt it is about, when not the current one (an old node deleted
        after the job was requeued)."""
        job.state.add_event(
            {
                "time": time.time(),
                "event": event,
                "status": job.state.status.value,
                "attempt": attempt or job.state.attempt,
                "reason": text,
            }
        )
        log.info("%s: %s: %s", job.name, event, text)

    def _runner_kind(self, job: Job) -> str:
        return (job.spec.runner_kind if job.spec else None) or self.runners.default

    def _attempt_name(self, job: Job, purpose: str) -> str:
        state = job.state
        return attempt_name(self.store.root_url, job.name, state.submission, state.attempt, purpose)

    # -- reading the bucket ----------------------------------------------------------------

    def _recover(self, specs: dict[str, ObjectInfo]) -> None:
        """First cycle: load every state, so attempts are found by name, never started again."""
        if self.info:
            self.store.write_daemon_info({**self.info, "acting_since": time.time()})
        self.logs.forget_remote()
        states = self.store.list_states()
        names = sorted(states)
        raws = list(self._pool.map(_retrying(self._read_state_or_problem), names))
        self.jobs.clear()
        for name, raw in zip(names, raws, strict=True):
            if raw is None:
                continue
            try:
                if isinstance(raw, UnacceptableObject):
                    raise raw
                state = JobState.loads(raw)
            except Exception as e:
                log.error("%s: unreadable state file (%s); treating the job as new", name, e)
                continue
            state.mark_written()
            job = Job(name=name, state=state, written=raw, state_token=states[name].token)
            self.jobs[name] = job
            if name not in specs and state.status is not Status.COMPLETED:
                job.gone_from_bucket = True
            for purpose in (RUN, CLEANUP):
                record = lifecycle.attempt_record(state, purpose)
                if record is not None and not isinstance(record.get("name"), str):
                    # A state written before attempts had names: nothing to find it by.
                    self._apply(
                        job,
                        lifecycle.Observed(
                            purpose,
                            Observation(
                                Phase.LOST, "recorded by an older daemon without an attempt name"
                            ),
                        ),
                        time.time(),
                    )
            log.info(
                "%s: recovered in state %s (attempt %d)", name, state.status.value, state.attempt
            )
        self._sweep()
        for job in self.jobs.values():
            for purpose in (RUN, CLEANUP):
                record = lifecycle.attempt_record(job.state, purpose)
                if record is not None and record.get("handle") is None:
                    # Recorded before the start, which may or may not have happened: start is
                    # idempotent by name (a runner that has it adopts it), so it happens once.
                    job.effects.append(lifecycle.Start(purpose))

    def _check_states(self) -> None:
        """Only the daemon writes states. One whose listing token is not the token of our own
        last write was written (or deleted) by someone else: report it and write ours back
        over it on this cycle's write-back, never acting on what it says."""
        listed = self.store.list_states()
        for name, job in self.jobs.items():
            info = listed.get(name)
            if not job.written or job.state_token is None:
                continue
            if job.state.status is Status.COMPLETED and info is None:
                continue  # our own finalize deleted it (its answer lost): not a foreign delete
            if info is not None and info.token != job.state_token:
                current = self.store.read_state_with_token(name)
                if current is not None and current[0] in (job.written, *job.attempted):
                    job.state_token = current[1]  # our own write, whose answer was lost
                    continue
            if info is None or info.token != job.state_token:
                log.error(
                    "%s: its state object was %s by someone else; restoring the daemon's own",
                    name,
                    "deleted" if info is None else "overwritten",
                )
                job.written = b""  # differs from the state: written back, over the foreign one
                job.state.changed = True

    def _read_state_or_problem(self, name: str) -> bytes | UnacceptableObject | None:
        try:
            return self.store.read_state(name)
        except UnacceptableObject as e:  # not a regular file: a problem, not a retry
            return e

    def _live_attempts(self) -> set[str]:
        names = set()
        for job in self.jobs.values():
            for record in (job.state.runner, job.state.cleanup_runner):
                if record and record.get("name"):
                    names.add(str(record["name"]))
        return names

    def _sweep(self) -> None:
        """Attempts a runner holds that no job's state names (their job ended or was deleted
        while we were down, or a daemon died between an attempt's end and its deletion) are
        orphans: delete them. Asks the runners in use and those the settings configure.

        Whose an item is comes from the runner (labels naming the attempt and the runner
        kind; ``Owned.name`` is the attempt's name), and an item whose attempt is live for
        any runner is never deleted, whichever runner listed it. Defense in depth: nor is an
        item named as a part of a live attempt (``<attempt>-<i>``, ``<attempt>-s<i>``: the
        nodes of a multislice queued resource whose node prefix is its attempt's name),
        should a runner ever list one as its own.
        """
        live = self._live_attempts()
        kinds = {self.runners.default, *self.runners.configured} | {
            str(r["kind"])
            for job in self.jobs.values()
            for r in (job.state.runner, job.state.cleanup_runner)
            if r and r.get("kind")
        }
        for kind in sorted(kinds):
            try:
                owned = self.runners.get(kind).list_owned()
            except Exception as e:
                log.error("could not list the attempts of runner %s: %s", kind, e)
                continue
            for item in owned:
                busy = item.name in self._deleting or item.name in self._deletes_in_pool
                part = _PART_OF_ATTEMPT.sub("", item.name)
                if part != item.name and part in live:
                    log.warning("not deleting %s (listed by runner %s): a part of live attempt "
                                "%s", item.name, kind, part)  # fmt: skip
                    continue
                if item.name not in live and not busy:
                    log.warning("deleting attempt %s: no job of this root names it", item.name)
                    self._deleting[item.name] = (kind, item.handle)

    def _read_specs(self, look: Look, now: float) -> None:
        """Take in the specs that changed. With the full listing: those whose listing token
        changed, and jobs whose spec is no longer listed are gone. Otherwise: the specs that
        submission markers name (and those of cancel requests for jobs not seen yet), each
        read with its token; one that is absent now is gone. See bastion/specwatch.py."""
        listed = look.specs
        if listed is not None:
            jobs = self.jobs
            changed = [n for n, i in listed.items() if n not in jobs or jobs[n].token != i.token]
            read: Callable[[str], Any] = self.store.read_spec
        else:
            unseen = {n for n in look.requests if n not in self.jobs and not name_problem(n)}
            changed = sorted(set(look.marked()) | unseen)
            read = self.store.read_spec_with_token
        results = dict(zip(changed, self._pool.map(_quietly(read), changed), strict=True))
        unread = set()
        for name in changed:
            result = results[name]
            # a token no listing has: the next full listing reads (and rejects) it again
            token = listed[name].token if listed is not None else "?"
            if isinstance(result, ValueError):  # not a regular file, too large: the spec is bad
                self._inputs_changed = True
                self._absorb_spec(name, b"", token, now, problem=str(result))
                continue
            if isinstance(result, Exception):
                log.error("%s: could not read spec: %s", name, result)
                unread.add(name)
                continue
            if result is None:  # deleted since it was listed or marked
                if listed is None:
                    self._spec_absent(name, marked=name in look.markers.values())
                continue
            raw, token = (result, token) if listed is not None else result
            job = self.jobs.get(name)
            if job is not None and job.token == token:
                continue  # marked, but what we read last: nothing new
            self._inputs_changed = True
            try:
                self._absorb_spec(name, raw, token, now)
            except Exception:
                log.exception("%s: could not take in the spec", name)
        if listed is not None:
            for name, job in self.jobs.items():
                if name not in listed and job.token and not job.gone_from_bucket:
                    job.gone_from_bucket = True
                    self._inputs_changed = True
        self.specwatch.taken_in(look, unread)  # its markers are deleted at the cycle's end

    def _spec_absent(self, name: str, marked: bool) -> None:
        """A spec read because a marker or request named it is not there: gone, if we knew
        the job; a marker for a spec never seen is reported (it is deleted all the same)."""
        job = self.jobs.get(name)
        if job is not None:
            if not job.gone_from_bucket:
                job.gone_from_bucket = True
                self._inputs_changed = True
        elif marked:
            log.warning(
                "%s: a submission marker names it but %s is absent (deleted since, or the "
                "marker was written without its spec); nothing to take in",
                name,
                self.store.url("jobs", "active", name),
            )

    def _absorb_spec(
        self, name: str, raw: bytes, token: str, now: float, problem: str = ""
    ) -> None:
        job = self.jobs.get(name)
        spec, problem = (None, problem) if problem else self._parse_spec(name, raw)
        if job is None:
            state = JobState(submit_time=now, submission=uuid.uuid4().hex[:12])
            job = self.jobs[name] = Job(name=name, state=state)
        job.token = token
        job.gone_from_bucket = False
        state = job.state
        if spec is None:
            if job.spec is None and not state.attempt:
                self._apply(job, lifecycle.Reject(f"spec rejected: {problem}"), now)
            else:
                state.reason = (
                    f"spec update ignored, the job keeps its last good spec: {problem}; "
                    f"fix {self.store.url('jobs', 'active', name)}"
                )
                log.error("%s: %s", name, state.reason)
            return
        if not state.job_identity:
            state.job_identity = spec.identity
            state.spec_digest = spec.digest()
            state.submission = state.submission or uuid.uuid4().hex[:12]
            job.spec = spec
            self._event(job, "PENDING", f"spec detected (job_id={spec.metadata.job_id})")
            return
        if state.job_identity != spec.identity:
            log.warning("%s: a new submission replaced job %s", name, state.job_identity)
        old, job.spec = job.spec, spec
        if spec.digest() == state.spec_digest:
            return
        changes = spec_changes(old, spec) if old is not None else []
        owner = (old or spec).metadata.user_id
        what = lifecycle.attributed("spec updated", spec.metadata.updated_by, owner)
        what += f": {', '.join(changes)} changed" if changes else ""
        if state.status is Status.PENDING:
            state.spec_digest = spec.digest()
            state.job_identity = spec.identity
            self._event(job, "UPDATED", f"{what} (while pending)")
        elif state.status is Status.ACTIVE and state.runner:
            update = lifecycle.Update(f"{what}; restarting with it", self.grace_seconds)
            self._apply(job, update, now)

    def _parse_spec(self, name: str, raw: bytes) -> tuple[JobSpec | None, str]:
        problem = name_problem(name)
        if problem:
            return None, f"file name: {problem}"
        try:
            spec = JobSpec.loads(raw)
        except (SpecError, RecursionError, ValueError, OverflowError) as e:
            return None, str(e)[:500]
        if spec.name != name:
            return None, (
                f"field name: spec says {spec.name[:80]!r} but its file is jobs/active/{name}; "
                "the file name is the job's key, make them equal"
            )
        return spec, ""

    def _apply_requests(self, requests: dict[str, ObjectInfo], now: float) -> None:
        """Requests are deleted once applied, so any that is listed still needs applying."""
        if requests:
            self._inputs_changed = True
        for name in requests:
            try:
                self._apply_request(name, now)
            except Exception:
                log.exception("%s: could not apply the user request; will retry", name)

    def _apply_request(self, name: str, now: float) -> None:
        try:
            raw = self.store.read_request(name)
        except ValueError as e:  # not a regular file or too large: drop it
            log.warning("%s: deleting an unreadable request: %s", name, e)
            self.store.delete_request(name)
            return
        if raw is None:
            return
        job = self.jobs.get(name)
        try:
            request = json.loads(raw)
            status = str(request.get("status", "")).upper()
        except (ValueError, AttributeError, RecursionError):
            request, status = {}, ""
        target = request.get("job_identity") if isinstance(request, dict) else None
        live = job is not None and job.spec is not None and not job.gone_from_bucket
        if not live or (target and target != job.state.job_identity):
            log.info(
                "%s: deleting a stale request (no such job, or it targets an earlier job "
                "of this name)",
                name,
            )
        elif status != "CANCELLING":
            log.warning(
                "%s: ignoring request with status %r (only CANCELLING is understood)",
                name,
                status[:80],
            )
        else:
            why = lifecycle.attributed("cancelled", requester(request), job.spec.metadata.user_id)
            self._apply(job, lifecycle.Cancel(why, self.grace_seconds), now)
        self.store.delete_request(name)

    # -- watching attempts -------------------------------------------------------------------

    def _observe(self, now: float) -> None:
        """Poll every attempt and copy its new output, in parallel; then feed what was seen."""
        for job in self.jobs.values():
            if job.gone_from_bucket and job.state.status in (Status.PENDING, Status.ACTIVE):
                self._apply(
                    job, lifecycle.Cancel("spec deleted from the bucket", self.grace_seconds), now
                )
        work = [
            (job, purpose)
            for job in self.jobs.values()
            if not job.inflight
            for purpose in (RUN, CLEANUP)
            if (lifecycle.attempt_record(job.state, purpose) or {}).get("handle") is not None
        ]
        results = self._pool.map(_quietly(self._watch), work)
        for (job, purpose), result in zip(work, results, strict=True):
            if isinstance(result, Exception):
                log.error("%s: could not watch its %s attempt: %s", job.name, purpose, result)
                if job.reason_before_blind is None:
                    job.reason_before_blind = job.state.reason
                job.state.reason = f"could not watch attempt {job.state.attempt}: {result}"[:500]
                continue
            if job.reason_before_blind is not None:  # watching again: the failure is over
                if job.state.reason.startswith("could not watch attempt"):
                    job.state.reason = job.reason_before_blind
                job.reason_before_blind = None
            try:
                if result.note and result.finished:  # before the outcome it belongs to
                    self._note(job, "LEFTOVERS", result.note)
                self._apply(job, lifecycle.Observed(purpose, result), now)
            except Exception:
                log.exception("%s: could not take in what its runner reported", job.name)
        for job in self.jobs.values():
            if job.state.stop and not job.inflight:
                self._apply(job, lifecycle.Tick(), now)

    def _watch(self, item: tuple[Job, str]) -> Observation:
        """Poll first, then copy output: a finished attempt's output is read to its end."""
        job, purpose = item
        record = lifecycle.attempt_record(job.state, purpose)
        assert record is not None
        runner = self.runners.get(record["kind"])
        observation = runner.poll(record["handle"])
        log_name = Store.log_name(job.name, cleanup=purpose == CLEANUP)
        while True:
            offset = max(0, self.logs.total(log_name) - int(record.get("origin") or 0))
            data = runner.read_output(record["handle"], offset, OUTPUT_CHUNK)
            if data:
                self.logs.append(log_name, data)
            if len(data) < OUTPUT_CHUNK or not observation.finished:
                break
        return observation

    # -- carrying out effects ----------------------------------------------------------------

    def _carry_out(self, now: float) -> None:
        """Hand decided effects to the pool, for jobs whose state (the write-ahead record of
        what is about to happen) is in the bucket. Results are taken in next cycle."""
        if self._start_retries:
            self._retry_starts(now)
        ready = [
            job
            for job in self.jobs.values()
            if job.effects and not job.inflight and not job.unwritten()
        ]
        deletes = list(self._deleting.items())
        if not ready and not deletes:
            return
        self._may_act()
        batch: list[Callable[[], None]] = []
        for job in ready:
            effects, job.effects = job.effects, []
            job.inflight += 1
            attempt = {
                p: self._attempt_for(job, p)
                for p in (RUN, CLEANUP)
                if any(isinstance(e, lifecycle.Start) and e.purpose == p for e in effects)
            }
            records = {p: lifecycle.attempt_record(job.state, p) for p in (RUN, CLEANUP)}
            batch.append(functools.partial(self._effects_of, job.name, effects, records, attempt))
        for name, (kind, handle) in deletes:
            self._deleting.pop(name, None)
            self._deletes_in_pool.add(name)  # the sweep must not take it for an orphan
            batch.append(functools.partial(self._delete_attempt, name, kind, handle))
        # A few tasks of many effects each: a thousand separate submissions make the decision
        # loop fight the pool's threads (busy forking processes) for the executor's locks.
        size = max(1, -(-len(batch) // self._workers))
        for i in range(0, len(batch), size):
            self._submit(_run_all, batch[i : i + size])

    def _submit(self, call: Callable[..., None], *args: Any) -> None:
        if self._effects_pool is None:  # made at first use: a standby daemon needs none
            self._effects_pool = _started_pool(self._workers, "bastion-effects")
        future = self._effects_pool.submit(call, *args)
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)

    def _attempt_for(self, job: Job, purpose: str) -> Attempt | None:
        record = lifecycle.attempt_record(job.state, purpose)
        spec = job.spec
        if record is None or spec is None:
            return None
        command = spec.command if purpose == RUN else (spec.cleanup_command or "true")
        return Attempt(
            name=str(record["name"]),
            job=job.name,
            attempt=job.state.attempt,
            command=command,
            env=self._job_env(job),
            resources=dict(spec.metadata.resources),
            options=spec.runner_options,
            bundle=spec.bundle,
            fence=self.lease.term if self.lease is not None else 0,
            tier=job.state.tier,
            labels={
                "bastion-job": job.name[:63].lower(),
                "bastion-attempt": str(job.state.attempt),
            },
        )

    def _effects_of(
        self,
        job_name: str,
        effects: list[lifecycle.Effect],
        records: dict[str, dict[str, Any] | None],
        attempts: dict[str, Attempt | None],
    ) -> None:
        """In the pool: one job's effects, in order; results go to ``_done``."""
        results: list[lifecycle.Event] = []
        try:
            for effect in effects:
                record = records.get(effect.purpose)
                if record is None:
                    continue
                self._may_act()
                if isinstance(effect, lifecycle.Start):
                    attempt = attempts.get(effect.purpose)
                    if attempt is None:  # its spec is gone: nothing to start it from (if the
                        # runner has it after all, it is an orphan now: the sweep deletes it)
                        results.append(lifecycle.StartFailed(effect.purpose, "its spec is gone"))
                        continue
                    try:
                        handle = self.runners.get(record["kind"]).start(attempt)
                    except RunnerError as e:  # the job's error: its attempt fails with it
                        log.error("%s: could not start %s: %s", job_name, attempt.name, e)
                        results.append(lifecycle.StartFailed(effect.purpose, str(e)[:1000]))
                        continue
                    except Fenced:
                        raise
                    except Exception as e:  # transient: the same start again, backing off
                        bound = None if isinstance(e, NoCapacity) else self.start_give_up_seconds
                        log.warning("%s: starting %s: %s; trying again", job_name, attempt.name, e)
                        results.append(
                            lifecycle.StartDeferred(effect.purpose, str(e)[:500], bound)
                        )
                        continue
                    record = {**record, "handle": handle}
                    records[effect.purpose] = record
                    results.append(lifecycle.Started(effect.purpose, handle))
                elif isinstance(effect, lifecycle.Stop) and record.get("handle") is not None:
                    self.runners.get(record["kind"]).stop(record["handle"], effect.deadline)
        except NotHolding:
            log.error("%s: effects not carried out: the lease is not certainly ours", job_name)
        except Fenced as e:  # a newer daemon has started attempts: we are a stale holder
            log.error("%s: effects not carried out: %s", job_name, e)
            self._lost_ownership = True
        except Exception:
            log.exception("%s: carrying out effects failed; retried next cycle", job_name)
        with self._done_lock:
            self._done.extend((job_name, event) for event in results)
            self._done.append((job_name, None))  # marks the batch as finished

    def _delete_attempt(self, name: str, kind: str, handle: dict[str, Any] | None) -> None:
        try:
            self._may_act()
            # An attempt that never started has nothing to delete (its kind may be unknown).
            gone = handle is None or self.runners.get(kind).delete(handle)
        except NotHolding:  # tried again once we act (or dropped if we let go)
            gone = False
        except Exception as e:
            log.error("could not delete attempt %s (will retry): %s", name, e)
            gone = False
        with self._done_lock:
            if gone:
                self._deleted.append((name, kind, handle))
            else:
                self._undeleted.append((name, kind, handle))

    def _take_in_results(self) -> None:
        with self._done_lock:
            done, self._done = self._done, []
            undeleted, self._undeleted = self._undeleted, []
            deleted, self._deleted = self._deleted, []
        for name, kind, handle in undeleted:  # retried next cycle until verified gone
            self._deletes_in_pool.discard(name)
            self._deleting.setdefault(name, (kind, handle))
        for name, kind, handle in deleted:
            self._deletes_in_pool.discard(name)
            owner = self._deletes_of.pop(name, None)
            job = self.jobs.get(owner[0]) if owner else None
            if job is not None and (what := self._describe(kind, handle)):
                self._note(job, "DELETED", f"deleted {what}", attempt_number(name))
        now = time.time()
        for job_name, event in done:
            job = self.jobs.get(job_name)
            if job is None:
                continue
            if event is None:
                job.inflight = max(0, job.inflight - 1)
            elif isinstance(event, lifecycle.StartDeferred):
                self._apply(job, event, now)  # the job says why it waits, or it gave up
                self._start_later(job, event, now)
            else:
                self._start_retries.pop((job_name, getattr(event, "purpose", "")), None)
                self._apply(job, event, now)
                if isinstance(event, lifecycle.Started):
                    self._note_placed(job, event)

    def _start_later(self, job: Job, event: lifecycle.StartDeferred, now: float) -> None:
        """Schedule the next try of a start that failed transiently: next cycle after the
        first failure, then 1, 2, 4 ... seconds later up to START_RETRY_MAX_SECONDS (none for
        a wait for capacity: the runner backs off each zone itself), and never after its
        give-up time, so the last try is the one that gives up on time."""
        record = lifecycle.attempt_record(job.state, event.purpose)
        key = (job.name, event.purpose)
        if record is None or record.get("handle") is not None:  # it ended (gave up, cancelled)
            self._start_retries.pop(key, None)
            return
        tries = self._start_retries.get(key, (0, 0.0))[0] + 1
        delay = 0.0
        if event.give_up_after is not None and tries > 1:
            delay = min(START_RETRY_MAX_SECONDS, START_RETRY_FIRST_SECONDS * 2 ** (tries - 2))
            since = float(record.get("deferred_since") or now)
            delay = max(0.0, min(delay, since + event.give_up_after - now))
        self._start_retries[key] = (tries, now + delay)

    def _retry_starts(self, now: float) -> None:
        """Hand back the starts whose next try is due (their jobs' attempts still unstarted)."""
        for key, (_, due) in list(self._start_retries.items()):
            job = self.jobs.get(key[0])
            record = lifecycle.attempt_record(job.state, key[1]) if job else None
            if job is None or record is None or record.get("handle") is not None:
                del self._start_retries[key]
            elif due <= now and not job.inflight and lifecycle.Start(key[1]) not in job.effects:
                # (Its result reschedules or ends it; one lost to an error is tried again.)
                job.effects.append(lifecycle.Start(key[1]))

    def _note_placed(self, job: Job, event: lifecycle.Started) -> None:
        record = lifecycle.attempt_record(job.state, event.purpose)
        if record is not None and (what := self._describe(str(record["kind"]), event.handle)):
            self._note(job, "PLACED", f"attempt {job.state.attempt} on {what}")

    def _describe(self, kind: str, handle: dict[str, Any] | None) -> str | None:
        """What an attempt occupies, in the runner's words, for the job's history."""
        if handle is None:
            return None
        try:
            return self.runners.get(kind).describe(handle)
        except Exception:  # an unknown kind: nothing to tell
            return None

    def _job_env(self, job: Job) -> dict[str, str]:
        spec, state = job.spec, job.state
        assert spec is not None
        env = {
            "BASTION_JOB_NAME": job.name,
            "BASTION_ATTEMPT": str(state.attempt),
            "BASTION_ROOT": self.store.root_url,
            "BASTION_JOB_ID": spec.metadata.job_id or "",
            "BASTION_PROJECT_ID": spec.metadata.project_id,
            "BASTION_USER_ID": spec.metadata.user_id,
            "BASTION_TIER": "" if state.tier is None else str(state.tier),
            "BASTION_SPEC_URL": self.store.url("jobs", "active", job.name),
        }
        if job.spec_json[0] is not spec:  # serialized once per spec, not once per attempt
            job.spec_json = (spec, json.dumps(spec.to_json()))
        serialized = job.spec_json[1]
        if len(serialized) <= MAX_SPEC_ENV_BYTES:  # AXLearn's variable; past this, the URL
            env["_BASTION_SERIALIZED_JOBSPEC"] = serialized
        if spec.metadata.version:
            env["BASTION_JOB_VERSION"] = str(spec.metadata.version)
        env.update(spec.env_vars or {})
        return env

    # -- finishing ---------------------------------------------------------------------------

    def _finalize_all(self, now: float) -> None:
        """COMPLETED jobs whose state is written: recorded in complete/ and forgotten. Their
        bucket requests (history, record, two deletes each) run in the pool, jobs in parallel:
        a hundred jobs ending at once cost one round of requests, not four hundred in a row."""
        deleting = {
            owner for owner, since in self._deletes_of.values() if now - since < DELETE_WAIT_SECONDS
        }
        ready = [
            job
            for job in self.jobs.values()
            if job.state.status is Status.COMPLETED
            and not job.inflight
            and not job.effects
            and job.name not in deleting
            and not job.unwritten()
        ]
        if not ready:
            return
        mirrors = self._mirrors()
        for job in ready:
            if name_problem(job.name) is None:  # a rejected name owns no log
                for log_name in (job.name, Store.log_name(job.name, cleanup=True)):
                    if log_name in mirrors:
                        self.logs.close(log_name)
        self._may_act()
        results = self._pool.map(_quietly(functools.partial(self._finalize, now=now)), ready)
        for job, result in zip(ready, results, strict=True):
            if isinstance(result, Exception):
                log.error("%s: could not record the finished job (will retry): %s", job.name,
                          result)
            else:
                self.jobs.pop(job.name, None)  # its end was news to the policy already

    def _finalize(self, job: Job, now: float) -> None:
        """In the pool: one finished job's record in complete/, then its spec and state go."""
        state = job.state
        valid_name = name_problem(job.name) is None
        record = {"spec": job.spec.to_json() if job.spec else None, "state": state.to_json()}
        if job.spec is None:  # never read (a failed read after a recovery) or never valid
            try:
                raw = self.store.read_spec(job.name)
            except ValueError as e:  # a symlink or an oversized object: never copied
                raw = f"<not copied: {e}>".encode()
            try:
                record["spec"] = JobSpec.loads(raw).to_json() if raw else None
            except Exception:  # not a valid spec: its text, for the user to see
                record["spec_text"] = raw.decode(errors="replace")[:10_000] if raw else None
            if raw is None:  # deleted by an earlier try of this finalize: keep what it recorded
                earlier = self.store.read_complete(job.name)
                if earlier and earlier.get("spec") and earlier.get("state", {}).get(
                    "submission"
                ) == state.submission:
                    record["spec"] = earlier["spec"]
        submission = f"{int(state.submit_time or now):012d}-{state.submission or 'x'}"
        if valid_name:
            self.store.save_history(job.name, submission, state.events)  # long-term record
        self.store.write_complete(job.name, record)
        self.store.delete_spec(job.name)
        self.store.delete_state(job.name)

    def _mirrors(self) -> set[str]:
        return set(self.logs.mirrors())

    # -- scheduling ------------------------------------------------------------------------

    def _schedule(self, now: float) -> bool:
        """One policy pass and its decisions applied; False when it was not needed."""
        config = self.quota.config
        if not self._inputs_changed and config is self._planned_config and now < self._replan_at:
            return False  # no job changed and no time threshold passed: the last plan stands
        self._inputs_changed = False
        self._planned_config = config
        self._replan_at = now + REPLAN_SECONDS
        requests = policy_requests(((j.name, j.spec, j.state) for j in self.jobs.values()), now)
        if config is None:
            for job in self.jobs.values():
                if job.state.status is Status.PENDING:
                    job.state.reason = f"waiting for a valid quota file: {self.quota.error}"
            return True
        plan = schedule(config, requests, self.quota.usage_for(requests, now), now)
        self._replan_at = replan_by(config, requests, now, now + REPLAN_SECONDS)
        grace = config.scheduling.preemption_grace_seconds
        changed = []
        failed = False
        for name in sorted(plan.decisions):
            job = self.jobs[name]
            before = (job.state.status, job.state.reason)
            if (
                before[0] is Status.PENDING
                and before[1] is not None
                and plan.wait_text(name) == before[1]
            ):
                continue  # waits as it waited: nothing to apply, nothing to write
            decision = plan.decisions[name]  # (made only here for most waiting jobs)
            try:
                event = self._event_for(job, decision, grace)
                if event is not None:
                    self._apply(job, event, now)
            except Exception as e:
                log.exception("%s: acting on %s failed", name, decision.verdict)
                job.state.reason = f"could not {decision.verdict.value.lower()}: {e}"
                failed = True
            if (job.state.status, job.state.reason) != before:
                changed.append(decision)
        # The plan's own starts and preemptions are what it assumed: no new pass for them.
        self._inputs_changed = failed
        self._record_decisions(changed, now)
        self._publish_queue(plan)
        return True

    def _publish_queue(self, plan: Plan) -> None:
        """The facts every waiting job shares (order, free capacity, usage) in one object,
        written when they change: one request where rewriting each waiting job's state to
        carry its own position would be thousands."""
        order = {p: names for p, names in plan.waiting.items() if names}  # (queue order)
        projects = {
            p: {
                "waiting": len(order.get(p, ())),
                "order": order.get(p, [])[:QUEUE_NAMES_KEPT],
                "reasons": {  # the whole story for the first few; `bastion why` for any job
                    n: plan.decisions[n].reason[:500] for n in order.get(p, [])[:QUEUE_REASONS_KEPT]
                },
                "usage": dict(plan.usage.get(p, {})),
                "quota": dict(plan.quotas.get(p, {})),
            }
            for p in sorted(set(order) | set(plan.usage))
        }
        summary = {"free": dict(plan.free), "projects": projects}
        raw = json.dumps(summary, sort_keys=True)
        if raw == self._queue_written:
            return
        try:
            self._may_act()
            self.store.write_queue({**summary, "time": time.time(), "cycle": self.cycles})
            self._queue_written = raw
        except NotHolding:
            raise
        except Exception as e:  # a reader sees the last one; written again next cycle
            log.error("could not write the queue summary: %s", e)

    def _event_for(self, job: Job, decision: Decision, grace: float) -> lifecycle.Event | None:
        state, verdict = job.state, decision.verdict
        if verdict is Verdict.START and state.status is Status.PENDING:
            if job.spec is None:
                return None
            state.spec_digest = job.spec.digest()
            if state.attempt == 0:
                state.log_start = self.logs.total(job.name)
            name = attempt_name(
                self.store.root_url, job.name, state.submission, state.attempt + 1, RUN
            )
            return lifecycle.Admit(
                tier=decision.tier,
                reason=decision.reason,
                attempt_name=name,
                runner_kind=self._runner_kind(job),
                log_size=self.logs.total(job.name),
                backfill_for=tuple(decision.backfill_for),
            )
        if verdict is Verdict.PREEMPT:
            return lifecycle.Preempt(decision.reason, decision.preempted_by, grace)
        if verdict is Verdict.REJECT:
            return lifecycle.Reject(decision.reason)
        if verdict is Verdict.WAIT:
            # The stable part only: positions and free capacity go to the queue summary.
            return lifecycle.Wait(decision.wait or decision.reason)
        if verdict is Verdict.KEEP and decision.tier is not None and state.tier != decision.tier:
            state.tier = decision.tier  # recorded, never a restart
            self._inputs_changed = True
        return None

    def _record_decisions(self, changed: list[Decision], now: float) -> None:
        """One decision-log record per cycle in which a job's decision changed (a start, a
        preemption, a rejection, a new kind of wait), bounded in bytes: a burst of thousands
        of changes keeps the first and counts the rest."""
        if not changed:
            return
        entries, size, omitted = [], 0, 0
        for i, d in enumerate(changed):
            entry = {
                "name": d.name,
                "verdict": d.verdict.value,
                "reason": (d.wait or d.reason)[:500],
                "tier": d.tier,
                "preempted_by": d.preempted_by,
            }
            cost = len(json.dumps(entry))
            if size + cost > DECISION_RECORD_BYTES:
                omitted = len(changed) - i
                break
            entries.append(entry)
            size += cost
        record: dict[str, Any] = {"time": now, "cycle": self.cycles, "decisions": entries}
        if omitted:
            record["omitted"] = omitted
        try:
            self.store.write_decisions(now, record)
            self._decision_records += 1
            if self._decision_records % 100 == 0:
                self.store.prune_decisions(keep=DECISION_RECORDS_KEPT)
        except Exception:
            log.exception("could not write the decision log")

    # -- writing back ----------------------------------------------------------------------

    def _write_back_job(self, item: tuple[Job | None, list[str]]) -> bool:
        """A job's new log bytes, then its state if it changed (False: nothing to write)."""
        job, logs = item
        ended = job is not None and job.state.status is Status.COMPLETED
        for name in logs:
            try:
                if ended:
                    self.logs.flush(name)  # past the per-sync chunk bound: the last bytes too
                else:
                    self.logs.sync(name)
            except Exception as e:
                log.error("%s: log upload failed; it will be retried: %s", name, e)
        if job is None:
            return False
        self._may_act()
        return self._write_state(job)

    def _write_back(self) -> None:
        """Upload new log bytes and changed states: one pass, jobs in parallel.

        For each job its logs go first and then its state, so a state that says the job ended
        is written after the log's last bytes; a failed log upload is retried next cycle and
        does not hold the state back. A burst's thousands of uploads share one pass."""
        mirrors = set(self.logs.mirrors()) - {self.daemon_log}
        if self.cycles % SWEEP_EVERY_CYCLES == 0:
            self._check_marks()
        work: list[tuple[Job | None, list[str]]] = []
        for job in self.jobs.values():
            logs = [n for n in (job.name, Store.log_name(job.name, cleanup=True)) if n in mirrors]
            mirrors.difference_update(logs)
            if logs or job.unwritten():
                work.append((job, logs))
        work.extend((None, [name]) for name in sorted(mirrors))  # logs of jobs no longer here

        results = self._pool.map(_quietly(self._write_back_job), work)
        changed = False
        for (job, _), result in zip(work, results, strict=True):
            if job is None:
                continue
            changed = changed or result is not False
            if isinstance(result, (PreconditionFailed, NotHolding)):
                self._lost_ownership = True
            elif isinstance(result, Exception):
                log.error("%s: could not write state (will retry): %s", job.name, result)
        if self._lost_ownership:
            raise NotHolding
        self._usage_unsaved = self._usage_unsaved or changed
        self._save_usage()

    def _save_usage(self, force: bool = False) -> None:
        """The usage ledger needs saving only when a job's state changed (see QuotaSource),
        and then at most every USAGE_SAVE_SECONDS: a daemon that dies re-creates the accrual
        since from the jobs running at its restart, so at most that long is misattributed."""
        if not self._usage_unsaved:
            return
        if not force and time.monotonic() - self._usage_saved_at < USAGE_SAVE_SECONDS:
            return
        try:
            self.quota.save_usage()
            self._usage_saved_at = time.monotonic()
            self._usage_unsaved = False
        except Exception:
            log.exception("could not save the usage ledger")

    def _check_marks(self) -> None:
        """Now and then, every state's bytes against what was written: a change that escaped
        the marks (an in-place edit of a nested value) is a bug, reported and written."""
        for job in self.jobs.values():
            if not job.state.changed and job.written and job.state.dumps() != job.written:
                log.error("%s: its state changed without a mark; writing it", job.name)
                job.state.changed = True

    def _sync_daemon_log(self, force: bool = False) -> None:
        """The daemon's own log, at most every DAEMON_LOG_SYNC_SECONDS unless ``force``."""
        if not force and time.monotonic() - self._daemon_log_synced_at < DAEMON_LOG_SYNC_SECONDS:
            return
        self._daemon_log_synced_at = time.monotonic()
        try:
            self.logs.sync(self.daemon_log)
        except Exception as e:  # logging it would only add to the same log
            print(f"bastion: daemon log upload failed: {e}", flush=True)

    def _write_state(self, job: Job) -> bool:
        """Write the job's state if its bytes changed (False: unchanged, nothing sent)."""
        raw = job.state.dumps()
        if raw == job.written:
            job.state.mark_written()
            return False
        job.attempted.append(raw)
        try:
            job.state_token = self.store.write_state(job.name, raw, job.state_token)
        except PreconditionFailed:
            # Our own earlier write may have landed with its answer lost, or its new token
            # may be unknown: then the object holds bytes we wrote or tried, and we carry
            # on from its token. Otherwise another daemon (or someone else) wrote it.
            current = self.store.read_state_with_token(job.name)
            if current is None or current[0] not in (job.written, *job.attempted):
                if self.lease is None or not self.lease.valid():
                    raise
                # We hold the lease, so no daemon wrote this: a foreign write. Our state
                # stands; the forged bytes are reported and replaced, never acted on.
                log.error(
                    "%s: its state was overwritten by someone else (not a daemon); "
                    "restoring the daemon's own state",
                    job.name,
                )
                job.state_token = self.store.write_state(
                    job.name, raw, current[1] if current else None
                )
                job.written = raw
                job.attempted.clear()
                job.state.mark_written()
                return True
            job.state_token = current[1]
            if current[0] != raw:
                job.state_token = self.store.write_state(job.name, raw, job.state_token)
        job.written = raw
        job.attempted.clear()
        job.state.mark_written()
        return True

    def daemon_log_path(self) -> str:
        return self.logs.path(self.daemon_log)
