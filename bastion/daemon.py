"""The daemon: one cycle lists the bucket, reads what changed, decides, acts and writes back.

A cycle is cheap when nothing changed: specs and user requests are re-read only when their
listing token (generation, ETag or mtime/inode) changes, states are written only when their
bytes change, and logs upload only new bytes. Every per-job step is wrapped so one bad input
or one failed call is recorded on that job and never stops the cycle for the others.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bastion.jobspec import JobSpec, SpecError, name_problem
from bastion.jobstate import JobState, Outcome, Status, StopKind
from bastion.lease import Lease
from bastion.logsync import LogSync
from bastion.objects import ObjectInfo, PreconditionFailed
from bastion.quotas import QuotaSource
from bastion.runners.local import Launch, LocalRunner
from bastion.scheduling import job_request
from bastion.store import Store
from quota.policy import Decision, Verdict, schedule

log = logging.getLogger("bastion.daemon")

DEFAULT_GRACE_SECONDS = 30.0
DECISION_RECORDS_KEPT = 1000


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


@dataclass
class CycleReport:
    started: float
    seconds: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step of the cycle

    def slowest(self, count: int = 3) -> str:
        top = sorted(self.phases.items(), key=lambda kv: -kv[1])[:count]
        return ", ".join(f"{name} {seconds:.2f}s" for name, seconds in top)


def _identity_hash(state: JobState) -> str:
    return hashlib.sha1(state.job_identity.encode()).hexdigest()[:8]


def _attempt_key(name: str, state: JobState, kind: str) -> str:
    return f"{name}.{_identity_hash(state)}.{state.attempt}.{kind}"


def _quietly(call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """For pool.map: return the exception instead of raising it, so one failure stays local."""

    def wrapped(arg: Any) -> Any:
        try:
            return call(arg)
        except Exception as e:
            return e

    return wrapped


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


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + "Z"


class Daemon:
    def __init__(
        self,
        store: Store,
        runner: LocalRunner,
        work_dir: str,
        quota: QuotaSource,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        max_workers: int = 48,
        lease: Lease | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self.runner = runner
        self.quota = quota
        self.grace_seconds = grace_seconds
        self.logs = LogSync(store, os.path.join(work_dir, "logs"))
        self.daemon_log = Store.daemon_log_name(socket.gethostname(), os.path.abspath(work_dir))
        self.jobs: dict[str, Job] = {}
        self.cycles = 0
        self._decision_records = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers)
        self._stop = threading.Event()
        self._lost_ownership = False
        self._recovered = False
        self.info: dict[str, Any] = {}  # published to ROOT/history/daemon when we start acting

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
            if self.lease is not None:
                self.lease.release()
            self._sync_daemon_log()

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
        except Exception:  # a failed listing (bucket outage): log it and try again
            log.exception("cycle %d failed; retrying in %ss", self.cycles, poll_seconds)
        if self._lost_ownership:
            log.error("a state changed under us: another daemon acts on this root; stopping")
            if self.lease is not None:
                self.lease.token = None
            self._forget()

    def _forget(self) -> None:
        """Drop what we know; if we act again it starts with a full recovery from the bucket."""
        if self.jobs or self._recovered:
            log.info("not acting on %s; forgetting in-memory state", self.store.root_url)
        self.jobs.clear()
        self.cycles = 0
        self._recovered = False
        self._lost_ownership = False

    def cycle(self, now: float) -> CycleReport:
        ops_before = dict(self.store.ops)
        report = CycleReport(started=now)
        mark = time.perf_counter()

        def done(phase: str) -> None:
            nonlocal mark
            report.phases[phase] = time.perf_counter() - mark
            mark = time.perf_counter()

        specs = self.store.list_specs()
        requests = self.store.list_requests()
        done("list")
        if not self._recovered:
            self._recover(specs)  # raises if any state is unreadable: retried next cycle
            self._recovered = True
            done("recover")
        self.cycles += 1
        self.quota.refresh()
        done("quota")
        self._read_specs(specs, now)
        done("read_specs")
        self._apply_requests(requests, now)
        done("requests")
        self._each(self._supervise, now)
        done("supervise")
        self._schedule(now)
        done("schedule")
        self._write_back()
        done("write_back")
        self._each(self._finalize, now)
        done("finalize")
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
            except Exception as e:
                log.exception("%s: %s failed; retrying next cycle", job.name, step.__name__)
                if job.state.status is not Status.COMPLETED:  # keep the outcome's reason
                    job.state.reason = f"internal error in {step.__name__.strip('_')}: {e}"

    # -- reading the bucket ----------------------------------------------------------------

    def _recover(self, specs: dict[str, ObjectInfo]) -> None:
        """First cycle: load every state so running attempts are adopted, not started again."""
        if self.info:
            self.store.write_daemon_info({**self.info, "acting_since": time.time()})
        self.logs.forget_remote()
        states = self.store.list_states()
        names = sorted(states)
        raws = list(self._pool.map(_retrying(self.store.read_state), names))
        self.jobs.clear()
        for name, raw in zip(names, raws, strict=True):
            if raw is None:
                continue
            try:
                state = JobState.loads(raw)
            except (ValueError, TypeError, KeyError) as e:
                log.error("%s: unreadable state file (%s); treating the job as new", name, e)
                continue
            job = Job(name=name, state=state, written=raw, state_token=states[name].token)
            self.jobs[name] = job
            if name not in specs and state.status is not Status.COMPLETED:
                job.gone_from_bucket = True
            for attr in ("runner", "cleanup_runner"):
                handle = getattr(state, attr)
                if handle and handle.get("log_path"):
                    log_name = Store.log_name(name, cleanup=attr == "cleanup_runner")
                    self.logs.attach(log_name, handle["log_path"])
                if handle and not self.runner.adopt(handle):
                    log.warning(
                        "%s: attempt %d ran on host %s; it cannot be adopted here",
                        name,
                        state.attempt,
                        handle.get("host"),
                    )
                    setattr(state, attr, {**handle, "lost": True})
            log.info(
                "%s: recovered in state %s (attempt %d)", name, state.status.value, state.attempt
            )
        self._kill_orphans(set(specs) | set(states))

    def _kill_orphans(self, known: set[str]) -> None:
        """Attempts still running for a job the bucket no longer has (deleted while we were
        down) belong to nobody: stop them rather than let them hold the machine."""
        for handle in self.runner.live_attempts():
            name = str(handle["key"]).rsplit(".", 3)[0]
            if name not in known:
                log.warning("killing attempt %s: its job is gone from the bucket", handle["key"])
                self.runner.kill(handle)

    def _read_specs(self, specs: dict[str, ObjectInfo], now: float) -> None:
        changed = [
            n for n, info in specs.items() if n not in self.jobs or self.jobs[n].token != info.token
        ]
        raws = dict(
            zip(
                changed,
                self._pool.map(_quietly(self.store.read_spec), changed),
                strict=True,
            )
        )
        for name in changed:
            if isinstance(raws[name], Exception):
                log.error("%s: could not read spec: %s", name, raws[name])
                continue
            if raws[name] is None:
                continue  # deleted between the listing and the read
            try:
                self._absorb_spec(name, raws[name], specs[name].token, now)
            except Exception:
                log.exception("%s: could not take in the spec", name)
        for name, job in self.jobs.items():
            if name not in specs and job.token:
                job.gone_from_bucket = True

    def _absorb_spec(self, name: str, raw: bytes, token: str, now: float) -> None:
        job = self.jobs.get(name)
        spec, problem = self._parse_spec(name, raw)
        if job is None:
            job = self.jobs[name] = Job(name=name, state=JobState(submit_time=now))
        job.token = token
        job.gone_from_bucket = False
        state = job.state
        if spec is None:
            if job.spec is None and not state.attempt:
                job.spec = None
                self._complete(job, Outcome.REJECTED, f"spec rejected: {problem}", now)
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
            job.spec = spec
            self._event(job, "PENDING", f"spec detected (job_id={spec.metadata.job_id})")
            return
        if state.job_identity != spec.identity:
            log.warning("%s: a new submission replaced job %s", name, state.job_identity)
        job.spec = spec
        if spec.digest() == state.spec_digest:
            return
        if state.status is Status.PENDING:
            state.spec_digest = spec.digest()
            state.job_identity = spec.identity
            self._event(job, "UPDATED", "spec updated while pending")
        elif state.status is Status.ACTIVE and state.runner:
            self._stop_attempt(job, StopKind.UPDATE, "spec updated; restarting with it", now)

    def _parse_spec(self, name: str, raw: bytes) -> tuple[JobSpec | None, str]:
        problem = name_problem(name)
        if problem:
            return None, f"file name: {problem}"
        try:
            spec = JobSpec.loads(raw)
        except SpecError as e:
            return None, str(e)
        if spec.name != name:
            return None, (
                f"field name: spec says {spec.name!r} but its file is jobs/active/{name}; "
                "the file name is the job's key, make them equal"
            )
        return spec, ""

    def _apply_requests(self, requests: dict[str, ObjectInfo], now: float) -> None:
        """Requests are deleted once applied, so any that is listed still needs applying."""
        for name in requests:
            try:
                self._apply_request(name, now)
            except Exception:
                log.exception("%s: could not apply the user request; will retry", name)

    def _apply_request(self, name: str, now: float) -> None:
        raw = self.store.read_request(name)
        if raw is None:
            return
        job = self.jobs.get(name)
        try:
            request = json.loads(raw)
            status = str(request.get("status", "")).upper()
        except (ValueError, AttributeError):
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
                "%s: ignoring request with status %r (only CANCELLING is understood)", name, status
            )
        else:
            who = request.get("user_id") or "a user"
            self._cancel(job, f"cancelled by {who}", now)
        self.store.delete_request(name)

    # -- the state machine -----------------------------------------------------------------

    def _event(self, job: Job, event: str, reason: str) -> None:
        """Record a lifecycle event in the job's state: written with it, at no extra cost."""
        job.state.reason = reason
        job.state.add_event(
            {
                "time": time.time(),
                "event": event,
                "status": job.state.status.value,
                "attempt": job.state.attempt,
                "reason": reason,
            }
        )
        log.info("%s: %s: %s", job.name, event, reason)

    def _cancel(self, job: Job, reason: str, now: float) -> None:
        state = job.state
        if state.status is Status.PENDING:
            self._complete(job, Outcome.CANCELLED, reason, now)
        elif state.status is Status.ACTIVE:
            state.status = Status.CANCELLING
            self._stop_attempt(job, StopKind.CANCEL, reason, now)

    def _stop_attempt(
        self,
        job: Job,
        kind: StopKind,
        reason: str,
        now: float,
        by: str | None = None,
        grace: float | None = None,
    ) -> None:
        """SIGTERM now; SIGKILL to the whole group once ``grace`` seconds have passed."""
        state = job.state
        if state.stop and state.stop["kind"] == StopKind.CANCEL.value:
            return  # a cancel already in progress wins
        since = state.stop["since"] if state.stop else now
        state.stop = {
            "kind": kind.value,
            "since": since,
            "by": by,
            "killed": False,
            "grace": self.grace_seconds if grace is None else grace,
        }
        if state.runner and not state.runner.get("lost"):
            self.logs.write(
                job.name,
                f"=== [bastion] stopping attempt {state.attempt} ({kind.value}) at "
                f"{_fmt_time(now)}: {reason} ===",
            )
            self.runner.terminate(state.runner)
        self._event(job, kind.value.upper(), reason)

    def _supervise(self, job: Job, now: float) -> None:
        state = job.state
        if job.gone_from_bucket and state.status in (Status.PENDING, Status.ACTIVE):
            self._cancel(job, "spec deleted from the bucket", now)
        if state.status in (Status.ACTIVE, Status.CANCELLING) and state.runner:
            self._supervise_attempt(job, now)
        elif state.status is Status.CANCELLING:  # cancelled between attempts
            self._enter_cleaning(job, Outcome.CANCELLED, state.reason, now)
        if state.status is Status.CLEANING:
            self._supervise_cleanup(job, now)

    def _supervise_attempt(self, job: Job, now: float) -> None:
        state = job.state
        handle = state.runner
        assert handle is not None
        if handle.get("lost"):
            finished, code = True, None
        else:
            finished, code = self.runner.poll(handle)
        if not finished:
            stop = state.stop
            grace = stop.get("grace", self.grace_seconds) if stop else 0.0
            if stop and not stop["killed"] and now - stop["since"] >= grace:
                self.runner.kill(handle)
                stop["killed"] = True
                self._event(
                    job,
                    "KILLED",
                    f"still running {grace:g}s after SIGTERM; sent SIGKILL to its process group",
                )
            return
        state.exit_code = code
        state.end_time = now
        state.runner = None
        how = (
            "lost (its host is gone)"
            if handle.get("lost")
            else (f"exited with status {code}" if code is not None else "was killed")
        )
        self.logs.write(
            job.name, f"=== [bastion] attempt {state.attempt} {how} at {_fmt_time(now)} ==="
        )
        stop = state.stop
        state.stop = None
        if stop and stop["kind"] != StopKind.CANCEL.value:
            state.status = Status.PENDING
            state.tier = None
            what = "preempted" if stop["kind"] == StopKind.PREEMPT.value else "updated"
            self._event(job, "REQUEUED", f"attempt {state.attempt} {what}; waiting to restart")
        elif stop:
            self._enter_cleaning(job, Outcome.CANCELLED, state.reason, now)
        elif code == 0:
            self._enter_cleaning(job, Outcome.SUCCEEDED, "command exited with status 0", now)
        else:
            self._enter_cleaning(job, Outcome.FAILED, f"command {how}", now)

    def _enter_cleaning(self, job: Job, outcome: Outcome, reason: str, now: float) -> None:
        state = job.state
        state.outcome = outcome
        spec = job.spec
        if spec is None or not spec.cleanup_command:
            self._complete(job, outcome, reason, now)
            return
        state.status = Status.CLEANING
        self._event(job, "CLEANING", f"{reason}; running the cleanup command")
        launch = Launch(
            key=_attempt_key(job.name, state, "cleanup"),
            command=spec.cleanup_command,
            env=self._job_env(job),
            log_path=self.logs.path(Store.log_name(job.name, cleanup=True)),
        )
        try:
            state.cleanup_runner = self.runner.start(launch)
        except Exception as e:
            self._complete(job, outcome, f"{reason}; the cleanup command could not start: {e}", now)

    def _supervise_cleanup(self, job: Job, now: float) -> None:
        state = job.state
        handle = state.cleanup_runner
        if handle and not handle.get("lost"):
            finished, code = self.runner.poll(handle)
            if not finished:
                return
        else:
            code = None
        note = "" if code == 0 else f" (cleanup exited with status {code})"
        state.cleanup_runner = None
        self._complete(job, state.outcome or Outcome.FAILED, f"{state.reason}{note}", now)

    def _complete(self, job: Job, outcome: Outcome, reason: str, now: float) -> None:
        state = job.state
        state.status = Status.COMPLETED
        state.outcome = outcome
        state.end_time = state.end_time or now
        state.stop = None
        self._event(job, outcome.value, reason)

    def _finalize(self, job: Job, now: float) -> None:
        """A COMPLETED job (its state already written): record it in complete/, then forget it."""
        if job.state.status is not Status.COMPLETED or job.written != job.state.dumps():
            return
        for log_name in (job.name, Store.log_name(job.name, cleanup=True)):
            if log_name in self._mirrors():
                self.logs.close(log_name)
        record = {"spec": job.spec.to_json() if job.spec else None, "state": job.state.to_json()}
        if job.spec is None:
            raw = self.store.read_spec(job.name)
            record["spec_text"] = raw.decode(errors="replace") if raw else None
        submission = f"{int(job.state.submit_time or now):012d}-{_identity_hash(job.state)}"
        self.store.save_history(job.name, submission, job.state.events)  # long-term record
        self.store.write_complete(job.name, record)
        self.store.delete_spec(job.name)
        self.store.delete_state(job.name)
        del self.jobs[job.name]

    def _mirrors(self) -> set[str]:
        return set(self.logs.mirrors())

    # -- scheduling ------------------------------------------------------------------------

    def _schedule(self, now: float) -> None:
        config = self.quota.config
        requests = [
            request
            for job in self.jobs.values()
            if (request := job_request(job.name, job.spec, job.state, now)) is not None
        ]
        if config is None:
            for job in self.jobs.values():
                if job.state.status is Status.PENDING:
                    job.state.reason = f"waiting for a valid quota file: {self.quota.error}"
            return
        plan = schedule(config, requests, self.quota.usage_for(requests, now), now)
        changed = []
        for name, decision in sorted(plan.decisions.items()):
            job = self.jobs[name]
            before = (job.state.status, job.state.reason)
            try:
                self._act(job, decision, now, config.scheduling.preemption_grace_seconds)
            except Exception as e:
                log.exception("%s: acting on %s failed", name, decision.verdict)
                job.state.reason = f"could not {decision.verdict.value.lower()}: {e}"
            if (job.state.status, job.state.reason) != before:
                changed.append(decision)
        self._record_decisions(changed, now)

    def _record_decisions(self, changed: list[Decision], now: float) -> None:
        """One bounded decision-log record per cycle in which a decision changed."""
        if not changed:
            return
        record = {
            "time": now,
            "cycle": self.cycles,
            "decisions": [
                {
                    "name": d.name,
                    "verdict": d.verdict.value,
                    "reason": d.reason,
                    "tier": d.tier,
                    "preempted_by": d.preempted_by,
                }
                for d in changed
            ],
        }
        try:
            self.store.write_decisions(now, record)
            self._decision_records += 1
            if self._decision_records % 100 == 0:
                self.store.prune_decisions(keep=DECISION_RECORDS_KEPT)
        except Exception:
            log.exception("could not write the decision log")

    def _act(self, job: Job, decision: Decision, now: float, grace: float) -> None:
        state = job.state
        verdict = decision.verdict
        if verdict is Verdict.START and state.status is Status.PENDING:
            self._start_attempt(job, decision.tier, decision.reason, now)
        elif verdict is Verdict.PREEMPT and state.status is Status.ACTIVE and not state.stop:
            state.preemptions += 1
            self._stop_attempt(
                job, StopKind.PREEMPT, decision.reason, now, decision.preempted_by, grace
            )
        elif verdict is Verdict.REJECT and state.status is Status.PENDING:
            self._complete(job, Outcome.REJECTED, decision.reason, now)
        elif verdict is Verdict.WAIT and state.status is Status.PENDING:
            state.reason = decision.reason
        elif verdict is Verdict.KEEP and decision.tier is not None and state.tier != decision.tier:
            state.tier = decision.tier  # recorded, never a restart

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
            "_BASTION_SERIALIZED_JOBSPEC": json.dumps(spec.to_json()),
        }
        if spec.metadata.version:
            env["BASTION_JOB_VERSION"] = str(spec.metadata.version)
        env.update(spec.env_vars or {})
        return env

    def _start_attempt(self, job: Job, tier: int | None, reason: str, now: float) -> None:
        spec, state = job.spec, job.state
        assert spec is not None
        if state.attempt == 0:
            state.log_start = self.logs.base(job.name)
        state.attempt += 1
        state.tier = tier
        state.spec_digest = spec.digest()
        state.start_time = now
        state.end_time = None
        state.exit_code = None
        self.logs.write(
            job.name,
            f"=== [bastion] attempt {state.attempt} of {job.name} started "
            f"at {_fmt_time(now)} (tier {tier}) ===",
        )
        launch = Launch(
            key=_attempt_key(job.name, state, "run"),
            command=spec.command,
            env=self._job_env(job),
            log_path=self.logs.path(job.name),
            gpus=int(spec.metadata.resources.get("gpu", 0)),
        )
        try:
            state.runner = self.runner.start(launch)
        except Exception as e:
            self.logs.write(
                job.name, f"=== [bastion] attempt {state.attempt} could not start: {e} ==="
            )
            self._complete(job, Outcome.FAILED, f"could not start the command: {e}", now)
            return
        state.status = Status.ACTIVE
        self._event(job, "STARTED", f"attempt {state.attempt} started: {reason}")

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
        return job is not None and self._write_state(job)

    def _write_back(self) -> None:
        """Upload new log bytes and changed states: one pass, jobs in parallel.

        For each job its logs go first and then its state, so a state that says the job ended
        is written after the log's last bytes; a failed log upload is retried next cycle and
        does not hold the state back. A burst's thousands of uploads share one pass."""
        mirrors = set(self.logs.mirrors()) - {self.daemon_log}
        work: list[tuple[Job | None, list[str]]] = []
        for job in self.jobs.values():
            logs = [n for n in (job.name, Store.log_name(job.name, cleanup=True)) if n in mirrors]
            mirrors.difference_update(logs)
            if logs or job.state.dumps() != job.written:
                work.append((job, logs))
        work.extend((None, [name]) for name in sorted(mirrors))  # logs of jobs no longer here

        results = self._pool.map(_quietly(self._write_back_job), work)
        changed = False
        for (job, _), result in zip(work, results, strict=True):
            if job is None:
                continue
            changed = changed or result is not False
            if isinstance(result, PreconditionFailed):
                self._lost_ownership = True
            elif isinstance(result, Exception):
                log.error("%s: could not write state (will retry): %s", job.name, result)
        if changed:
            try:
                self.quota.save_usage()  # only needed when something changed (see QuotaSource)
            except Exception:
                log.exception("could not save the usage ledger")

    def _sync_daemon_log(self) -> None:
        try:
            self.logs.sync(self.daemon_log)
        except Exception as e:  # logging it would only add to the same log
            print(f"bastion: daemon log upload failed: {e}", flush=True)

    def _write_state(self, job: Job) -> bool:
        """Write the job's state if its bytes changed (False: unchanged, nothing sent)."""
        raw = job.state.dumps()
        if raw == job.written:
            return False
        job.attempted.append(raw)
        try:
            job.state_token = self.store.write_state(job.name, raw, job.state_token)
        except PreconditionFailed:
            # Our own earlier write may have landed with its answer lost, or its new token
            # may be unknown: then the object holds bytes we wrote or tried, and we carry
            # on from its token. Otherwise another daemon wrote it.
            current = self.store.read_state_with_token(job.name)
            if current is None or current[0] not in (job.written, *job.attempted):
                raise
            job.state_token = current[1]
            if current[0] != raw:
                job.state_token = self.store.write_state(job.name, raw, job.state_token)
        job.written = raw
        job.attempted.clear()
        return True

    def daemon_log_path(self) -> str:
        return self.logs.path(self.daemon_log)
