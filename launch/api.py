"""The Python API users call: build, submit, cancel, list, inspect and tail jobs.

Everything here needs nothing but access to the bucket, so it works from any machine::

    from launch import Client, new_jobspec
    client = Client("gs://my-bucket/bastion")          # or a local directory
    spec = new_jobspec(name="hello", command="echo hi", user_id="me", project_id="default")
    client.submit(spec)
    for chunk in client.follow_log("hello"):
        print(chunk, end="")
    print(client.get("hello").status)                   # SUCCEEDED
"""

from __future__ import annotations

import codecs
import concurrent.futures
import contextlib
import datetime as dt
import getpass
import json
import os
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from bastion import jobspec as _jobspec
from bastion.bucket.specwatch import FULL_LISTING_SECONDS
from bastion.bucket.store import Store, UnacceptableObject, resolve_root
from bastion.jobspec import ExecLimitError, JobSpec, SpecError, check_name, shorten
from bastion.jobstate import JobState, Outcome, Status
from launch.status import DaemonStatus, NoDaemon, NoDaemonWarning, daemon_status
from quota.capacity import fmt_units

__all__ = [
    "Client",
    "ExecLimitError",
    "JobExists",
    "JobInfo",
    "NoDaemon",
    "NoDaemonWarning",
    "NotOwner",
    "SpecError",
    "UnknownJob",
    "default_user",
    "new_jobspec",
]


MAX_FOLLOW_FAILURES = 10
NO_DAEMON_SECONDS = 30.0  # follow_log gives up after this long with no daemon acting
LOG_CHUNK = 1 << 20  # logs are read and yielded in pieces of at most this many bytes


class UnknownJob(LookupError):
    """No active or completed job of that name."""


class JobExists(FileExistsError):
    """A job of that name is still active; names are keys."""


class NotOwner(PermissionError):
    """An update or cancel of another user's job without ``force``; nothing was written.

    The message says how to do it anyway in the API's words (``force=True``);
    ``message(flag)`` in the CLI's (``--force``)."""

    def __init__(self, verb: str, name: str, owner: str, requester: str, source: str) -> None:
        self.verb, self.name, self.owner = verb, name, owner
        self.requester, self.source = requester, source
        super().__init__(self.message("force=True", "user_id="))

    def message(self, force: str, user: str) -> str:
        source = user.rstrip("=") if self.source == "given" else self.source
        return (
            f"{self.verb} {self.name}: the job belongs to {self.owner!r} and you are "
            f"{self.requester!r} (from {source}); nothing was changed. Pass {force} to "
            f"{self.verb} another user's job anyway (its history will name you and the owner), "
            f"or {user}{self.owner} if you are {self.owner!r}"
        )


def default_user() -> str:
    return os.environ.get("BASTION_USER") or getpass.getuser()


def new_jobspec(
    *, name: str, command: str, user_id: str, project_id: str, **kwargs: Any
) -> JobSpec:
    """Build and validate a spec; raises SpecError naming the bad field (an empty command or
    user id too: the daemon could never run or attribute such a job)."""
    if not isinstance(command, str) or not command.strip():
        raise SpecError("field command: give the command the job runs, e.g. 'python train.py'")
    if not isinstance(user_id, str) or not user_id.strip():
        raise SpecError("field metadata.user_id: give the user the job runs for, e.g. 'alice'")
    resources = kwargs.get("resources")
    if resources is not None and not isinstance(resources, Mapping):
        raise SpecError("field metadata.resources: expected an object of type -> count")
    return _jobspec.new_jobspec(
        name=name, command=command, user_id=user_id, project_id=project_id, **kwargs
    )


def default_job_name(user: str | None = None) -> str:
    prefix = "".join(c for c in (user or default_user()) if c.isalnum() or c in "-.") or "job"
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@dataclass
class JobInfo:
    """A job as a user sees it: its spec (None if unreadable) and its state."""

    name: str
    spec: JobSpec | None
    state: JobState | None  # None: the daemon has not seen the spec yet
    finished: bool = False  # True once the daemon moved it to jobs/complete/
    problem: str = ""  # why its spec, state or record could not be read or parsed
    queue: str = ""  # a waiting job's place in its queue, from the daemon's queue summary
    live_reason: str = ""  # the whole current reason (the summary has it for a queue's first)

    @property
    def workers(self) -> list[str]:
        """Each worker's health of a running multi-host attempt ("running", "late", "lost",
        "exit 0", "preempted", "waiting"), as the daemon last saw it; [] otherwise."""
        if self.state is None or self.state.status is not Status.ACTIVE:
            return []
        return [str(w) for w in (self.state.runner or {}).get("workers") or []]

    @property
    def worker_summary(self) -> str:
        """``4/4 running``, or ``3/4 running; late: w2``: the healthy count, then who is not."""
        words = self.workers
        if not words:
            return ""
        others: dict[str, list[int]] = {}
        for index, word in enumerate(words):
            if word != "running":
                others.setdefault(word, []).append(index)
        parts = [f"{len(words) - sum(map(len, others.values()))}/{len(words)} running"]
        for word, indices in others.items():
            shown = ",".join(f"w{i}" for i in indices[:4])
            parts.append(f"{word}: {shown}" + (f",+{len(indices) - 4}" if len(indices) > 4 else ""))
        return "; ".join(parts)

    @property
    def status(self) -> str:
        if self.state:
            return self.state.display_status
        return "UNREADABLE" if self.problem else "SUBMITTED"

    @property
    def reason(self) -> str:
        if self.problem:
            return self.problem
        if self.state is None:
            return "waiting for the daemon to pick it up"
        if self.state.status is Status.PENDING and self.live_reason:
            return self.live_reason
        if self.state.status is Status.PENDING and self.queue:
            return f"{self.state.reason}; {self.queue}"
        return self.state.reason

    def to_json(self) -> dict[str, Any]:
        """One object per job, fields named as in the spec and the state."""
        data: dict[str, Any] = {"name": self.name, "status": self.status}
        if self.spec:
            meta = self.spec.metadata
            data.update(
                command=self.spec.command,
                user_id=meta.user_id,
                project_id=meta.project_id,
                resources=meta.resources,
                priority=meta.priority,
                job_id=meta.job_id,
                creation_time=meta.creation_time.isoformat() + "Z",
                runner=self.spec.runner,
                bundle=self.spec.bundle,  # enough to rerun the exact code
            )
        if self.workers:
            data["workers"] = self.workers
        data["state"] = self.state.to_json() if self.state else None
        if self.problem:
            data["problem"] = self.problem
        return data


class Client:
    def __init__(self, root: str | None = None, store: Store | None = None) -> None:
        self.store = store or Store(resolve_root(root))

    # -- submit, update, cancel ------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobSpec:
        """Write the spec; a NoDaemonWarning (warnings) when no daemon acts on the root."""
        spec.validate()
        if not self.store.specs.submit(spec.name, spec.dumps()):
            raise JobExists(
                f"a job named {spec.name!r} is already active in "
                f"{self.store.specs.url()}; pick another --name, or "
                f"`bastion update {spec.name}` to change it"
            )
        self._mark(spec.name)
        status = self.daemon_status()
        if status.stopped:
            warnings.warn(NoDaemonWarning(f"{spec.name} waits: {status.message}"), stacklevel=2)
        return spec

    def daemon_status(self) -> DaemonStatus:
        """Whether a daemon acts on this root, from its lease (``.acting``, ``.message``)."""
        try:
            return daemon_status(self.store)
        except Exception as e:
            return DaemonStatus(None, f"could not read the lease: {_brief(e)}")

    def update(
        self, name: str, command: str, user_id: str | None = None, force: bool = False
    ) -> JobSpec:
        """Give an active job a new command; a running attempt restarts with it.

        ``user_id``: who asks (default: $BASTION_USER, else the login name, as for a launch).
        Another user's job raises NotOwner and writes nothing, unless ``force``. The job keeps
        its owner: it goes on running, metered and with $BASTION_USER_ID, as the owner's; the
        spec records who wrote this version (``metadata.updated_by``) and the history names
        both ("spec updated by bob (owner alice): command changed")."""
        spec = self._active_spec(name)
        spec.metadata.updated_by = self._check_owner("update", spec, user_id, force)
        spec.command = command
        spec.metadata.version = (spec.metadata.version or 0) + 1
        self.store.specs.replace(name, spec.validate().dumps())
        self._mark(name)
        return spec

    def _mark(self, name: str) -> None:
        """The submission marker that makes the daemon read this spec next cycle instead of
        finding it by its periodic full listing (bastion/bucket/specwatch.py). The spec is written
        already, so a failure here loses nothing: it only waits longer, as the warning says."""
        try:
            self.store.requests.write_marker(name)
        except Exception as e:
            warnings.warn(
                f"{name} is submitted, but its submission marker could not be written "
                f"({_brief(e)}): the daemon finds it by its full listing, within "
                f"{FULL_LISTING_SECONDS:g}s on a large queue",
                stacklevel=3,
            )

    def cancel(self, name: str, user_id: str | None = None, force: bool = False) -> None:
        """Ask the daemon to stop an active job (its history: "cancelled by bob (owner alice)").

        ``user_id``: who asks (default: $BASTION_USER, else the login name, as for a launch).
        Another user's job raises NotOwner and writes nothing, unless ``force``."""
        spec = self._active_spec(name)
        who = self._check_owner("cancel", spec, user_id, force)
        request = _jobspec.cancel_request(spec.identity, who, time.time())
        self.store.requests.write(name, json.dumps(request).encode())

    @staticmethod
    def _check_owner(verb: str, spec: JobSpec, user_id: str | None, force: bool) -> str:
        """Who asks; NotOwner when that is not the job's owner and ``force`` is not given.

        A guard against changing someone else's job by accident, not a security boundary:
        whoever can write the bucket can write any object in it (README, "Who may change a
        job")."""
        who = user_id or default_user()
        if who != spec.metadata.user_id and not force:
            source = (
                "given"
                if user_id
                else ("$BASTION_USER" if os.environ.get("BASTION_USER") else "the login name")
            )
            raise NotOwner(verb, spec.name, spec.metadata.user_id, who, source)
        return who

    def _active_spec(self, name: str) -> JobSpec:
        check_name(name)
        raw = self._read_spec(name)
        if raw is None:
            record = self.store.complete.read(name)
            if record:
                status = JobState.from_json(record["state"]).display_status
                raise UnknownJob(f"job {name!r} has already finished ({status})")
            raise UnknownJob(self._unknown(name))
        return JobSpec.loads(raw)

    def _read_spec(self, name: str) -> bytes | None:
        """A spec's bytes; SpecError when it is no regular file or too large (local root)."""
        try:
            return self.store.specs.read(name)
        except UnacceptableObject as e:
            raise SpecError(str(e)) from None

    def _unknown(self, name: str) -> str:
        return (
            f"no job named {name!r} in {self.store.root_url} (`bastion list --all` shows every job)"
        )

    # -- reading ---------------------------------------------------------------------------

    def get(self, name: str) -> JobInfo:
        check_name(name)
        job = self._active(name)
        if job is not None:
            return _placed([job], self.queue())[0]
        job = self._completed(name)
        if job is None:
            raise UnknownJob(self._unknown(name))
        return job

    def list_jobs(self, include_completed: bool = False) -> list[JobInfo]:
        """Every job; one whose objects cannot be read or parsed (any bucket writer can put
        anything there) is a row with the reason (``problem``), never an error for the list."""
        names = sorted(self.store.specs.list())
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            jobs = [job for job in pool.map(self._active, names) if job is not None]
            if include_completed:
                done = sorted(set(self.store.complete.list()) - set(names))
                jobs += [job for job in pool.map(self._completed, done) if job is not None]
        return sorted(_placed(jobs, self.queue()), key=lambda j: j.name)

    def queue(self) -> dict[str, Any]:
        """The daemon's queue summary (``ROOT/history/queue``): per project the waiting jobs
        in order (the first 1,000), their count, usage and quota, and the free capacity; {}
        before a daemon has written one."""
        try:
            return self.store.queue.read() or {}
        except Exception:  # a reader's convenience: the list works without it
            return {}

    def _active(self, name: str) -> JobInfo | None:
        """An active job from its spec and state; None when it has no spec (any more)."""
        spec, problem = None, ""
        try:
            raw = self.store.specs.read(name)
            if raw is None:
                return None
            spec = JobSpec.loads(raw)
        except (SpecError, UnacceptableObject) as e:
            problem = f"spec rejected: {e}"  # as the daemon will reject it
        except Exception as e:
            problem = f"spec unreadable: {_brief(e)}"
        state = None
        try:
            raw_state = self.store.states.read(name)
            state = JobState.loads(raw_state) if raw_state else None
        except Exception as e:
            problem = problem or f"state unreadable: {_brief(e)}"
        return JobInfo(name, spec, state, problem=problem)

    def _completed(self, name: str) -> JobInfo | None:
        try:
            record = self.store.complete.read(name)
            return _from_record(name, record) if record is not None else None
        except Exception as e:
            return JobInfo(
                name, None, None, finished=True, problem=f"record unreadable: {_brief(e)}"
            )

    def history(self, name: str, all_submissions: bool = False) -> list[dict[str, Any]]:
        """This submission's lifecycle events; with ``all_submissions``, every job ever run
        under this name (from ``ROOT/history/jobs/NAME``)."""
        if all_submissions:
            check_name(name)
            events = list(self.store.history.read(name))
            if events:
                return events
        info = self.get(name)
        return list(info.state.events) if info.state else []

    def read_log(self, name: str, start: int | None = None) -> bytes:
        """This submission's log so far (earlier jobs of the same name are skipped)."""
        if start is None:
            info = self.get(name)
            start = info.state.log_start if info.state else 0
        return self.store.logs.read(name, start)

    def iter_log(self, name: str, start: int | None = None) -> Iterator[bytes]:
        """This submission's log so far in pieces of at most LOG_CHUNK bytes (bounded memory
        for a log of any size)."""
        if start is None:
            info = self.get(name)
            start = info.state.log_start if info.state else 0
        yield from self.store.logs.read_chunks(name, start, LOG_CHUNK)

    def worker_output(
        self, name: str, worker: int | None, follow: bool = False, poll_seconds: float = 1.0
    ) -> Iterator[bytes]:
        """One worker's output (``worker=None``: every worker's, lines prefixed), for every
        attempt of this submission of a multi-host job; see :mod:`launch.workers`. With
        ``follow``, until the job ends."""
        from launch import workers

        info = self.get(name)
        if info.state is None:
            return
        reader = workers.WorkerOutput(self.store, name, info.state.submission, worker)
        if not follow:
            yield from reader.new_output(info.state.attempt, final=True)
            return

        def attempts_now() -> tuple[int, bool]:
            now = self.get(name)
            ended = now.finished or (now.state is not None and now.state.status is Status.COMPLETED)
            return (now.state.attempt if now.state else 0), ended

        yield from workers.follow(reader, attempts_now, poll_seconds)

    def worker_count(self, name: str) -> int:
        """Workers that wrote output in any attempt of this submission (0: a one-process
        runner, whose output is the job's log)."""
        from launch import workers

        info = self.get(name)
        if info.state is None:
            return 0
        reader = workers.WorkerOutput(self.store, name, info.state.submission, None)
        seen = reader.workers_seen(info.state.attempt)
        return max(seen) + 1 if seen else 0

    def follow_log(
        self,
        name: str,
        poll_seconds: float = 1.0,
        timeout: float | None = None,
        no_daemon_timeout: float | None = NO_DAEMON_SECONDS,
    ) -> Iterator[str]:
        """Yield log text as it is written; returns once the job is finished.

        A failed bucket request is retried (the bucket may be briefly unreachable); only
        ``MAX_FOLLOW_FAILURES`` failures in a row give up. When no daemon acts on the root
        (its lease is absent, released or stale) for ``no_daemon_timeout`` seconds in a row,
        raises NoDaemon saying since when (None: wait forever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        info = self.get(name)
        offset: int | None = None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        failures = 0
        no_daemon_since: float | None = None
        while True:
            try:
                if offset is None and info.state is not None and info.state.attempt > 0:
                    offset = info.state.log_start
                if offset is not None:
                    for data in self.store.logs.read_chunks(name, offset, LOG_CHUNK):
                        offset += len(data)
                        yield decoder.decode(data)
                if info.finished:
                    if info.state and info.state.outcome is Outcome.REJECTED:
                        yield f"[bastion] job {name} was rejected: {info.state.reason}\n"
                    tail = decoder.decode(b"", final=True)
                    if tail:
                        yield tail
                    return
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"job {name!r} still {info.status} after {timeout}s")
                if no_daemon_timeout is not None:
                    status = self.daemon_status()
                    if not status.stopped:
                        no_daemon_since = None
                    elif no_daemon_since is None:
                        no_daemon_since = time.monotonic()
                    elif time.monotonic() - no_daemon_since >= no_daemon_timeout:
                        raise NoDaemon(
                            f"job {name} is {info.status} and nothing will change: {status.message}"
                        )
                time.sleep(poll_seconds)
                info = self.get(name)
                failures = 0
            except (UnknownJob, TimeoutError, NoDaemon):
                raise
            except Exception:
                failures += 1
                if failures >= MAX_FOLLOW_FAILURES:
                    raise
                time.sleep(min(30.0, poll_seconds * 2**failures))

    def wait(self, name: str, poll_seconds: float = 1.0, timeout: float | None = None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get(name)
            if info.finished:
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {name!r} still {info.status} after {timeout}s")
            time.sleep(poll_seconds)


def _brief(error: BaseException) -> str:
    """An exception as one bounded line for a row of `bastion list`."""
    return shorten(f"{type(error).__name__}: {error}".replace("\n", " "), 200)


def _from_record(name: str, record: dict[str, Any]) -> JobInfo:
    spec = None
    if record.get("spec"):
        try:
            spec = JobSpec.from_json(record["spec"])
        except SpecError:
            spec = None
    state = JobState.from_json(record["state"])
    return JobInfo(name, spec, state, finished=state.status is Status.COMPLETED)


def age_seconds(info: JobInfo, now: dt.datetime | None = None) -> float:
    if info.spec is None:
        return 0.0
    now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    return (now - info.spec.metadata.creation_time).total_seconds()


def _placed(jobs: list[JobInfo], summary: Mapping[str, Any]) -> list[JobInfo]:
    """Waiting jobs with their place in the queue: "3rd of 120 waiting in default"."""
    projects = summary.get("projects")
    if not isinstance(projects, Mapping):
        return jobs
    where: dict[str, str] = {}
    live: dict[str, str] = {}
    for project, entry in projects.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("order"), list):
            continue
        reasons = entry.get("reasons")
        if isinstance(reasons, Mapping):
            live.update((str(n), str(r)) for n, r in reasons.items())
        waiting = entry.get("waiting")
        total = f" of {waiting}" if isinstance(waiting, int) else ""
        for i, name in enumerate(entry["order"]):
            where[str(name)] = f"{_ordinal(i + 1)}{total} waiting in {project}"
    free = summary.get("free")
    tail = ""
    if isinstance(free, Mapping) and free:
        with contextlib.suppress(TypeError, ValueError):  # a foreign summary: no tail
            tail = f"; {fmt_units(free, zeros=True)} free in the pool"
    placed = []
    for job in jobs:
        pending = job.state is not None and job.state.status is Status.PENDING
        if pending and job.name in where:
            job = replace(job, queue=where[job.name] + tail, live_reason=live.get(job.name, ""))
        placed.append(job)
    return placed


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
