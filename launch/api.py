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

import concurrent.futures
import getpass
import json
import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bastion import heap
from bastion import jobspec as _jobspec
from bastion.bucket.outputs import OutputFile
from bastion.bucket.snapshot import ActiveJob, read_active
from bastion.bucket.specwatch import FULL_LISTING_SECONDS
from bastion.bucket.store import Store, UnacceptableObject, resolve_root
from bastion.jobrow import JobRow
from bastion.jobspec import ExecLimitError, JobSpec, SpecError, check_name
from bastion.jobstate import JobState, Status
from bastion.retry import quietly
from launch import expand, submitting
from launch import outputs as _outputs
from launch import runs as runs_
from launch.jobinfo import JobInfo, age_seconds, brief, from_record, parsed, placed
from launch.status import DaemonStatus, NoDaemon, NoDaemonWarning, daemon_status

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
    "age_seconds",
    "default_user",
    "new_jobspec",
]


MAX_FOLLOW_FAILURES = 10
NO_DAEMON_SECONDS = 30.0  # follow_log gives up after this long with no daemon acting
LOG_CHUNK = 1 << 20  # logs are read and yielded in pieces of at most this many bytes


class UnknownJob(LookupError):
    """No active or completed job of that name."""


class AlreadyFinished(UnknownJob):
    """No active job of that name: its run has finished (``status``, as `bastion list` says)."""

    def __init__(self, name: str, status: str) -> None:
        super().__init__(f"job {name!r} has already finished ({status})")
        self.name, self.status = name, status


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


class Client:
    def __init__(
        self, root: str | None = None, store: Store | None = None, expect_daemon: bool = True
    ) -> None:
        """``expect_daemon=False``: the caller runs the daemon itself (in process, a cycle at a
        time, as the tests do), so submit neither looks for one nor warns that none acts."""
        self.store = store or Store(resolve_root(root))
        self.expect_daemon = expect_daemon

    # -- submit, update, cancel ------------------------------------------------------------

    def submit(self, spec: JobSpec) -> JobSpec:
        """Write the spec; a NoDaemonWarning (warnings) when no daemon acts on the root.
        SpecError, nothing written, when a job it waits for (``after``) does not exist or the
        wait would close a cycle."""
        spec.validate()
        submitting.check_dependencies(self.store, [spec])
        if not self.store.specs.submit(spec.name, spec.dumps()):
            raise JobExists(
                f"a job named {spec.name!r} is already active in "
                f"{self.store.specs.url()}; pick another --name, or "
                f"`bastion update {spec.name}` to change it"
            )
        self._mark(spec.name)
        if not self.expect_daemon:
            return spec
        status = self.daemon_status()
        if status.stopped:
            warnings.warn(NoDaemonWarning(f"{spec.name} waits: {status.message}"), stacklevel=2)
        return spec

    def launch(
        self,
        name: str,
        command: str,
        *,
        user_id: str | None = None,
        project_id: str = "default",
        time_limit: float | str | None = None,
        after: str | list[str] | None = None,
        after_any: bool = False,
        array: str | None = None,
        sweep: str | None = None,
        **spec_fields: Any,
    ) -> list[JobSpec]:
        """Build and submit a job, or with ``array`` ("0-99%8") or ``sweep`` (a sweep file's
        path) a group of them (see launch/expand.py); the specs written. ``time_limit``:
        seconds or "2h"; ``after``: the jobs it waits for (to succeed; ``after_any``: to
        end). Every check runs before anything is written."""
        template = new_jobspec(
            name=name,
            command=command,
            user_id=user_id or default_user(),
            project_id=project_id,
            time_limit=time_limit,
            after=after,
            after_any=after_any,
            **spec_fields,
        )
        if array is not None and sweep is not None:
            raise SpecError("give array or sweep, not both: a group is one or the other")
        if array is None and sweep is None:
            return [self.submit(template)]
        found = expand.parse_array(array) if array is not None else expand.load_sweep(sweep or "")
        return self.submit_group(expand.expand(template, found))

    def submit_group(self, specs: list[JobSpec]) -> list[JobSpec]:
        """Write the specs of a group (``submitting.write_group``: a thousand per call), after
        checking them all: each valid, no name active already, every dependency there and no
        cycle. JobExists names the ones a writer took meanwhile, GroupPartlyWritten the ones
        the bucket failed (the others are submitted either way)."""
        for spec in specs:
            spec.validate()
        submitting.check_dependencies(self.store, specs)
        submitting.check_names_free(self.store, specs)

        wrote = submitting.write_group(self.store, specs)
        if wrote.unmarked:
            self._warn_unmarked(wrote.unmarked)
        if wrote.failed:
            raise submitting.GroupPartlyWritten(
                f"{len(specs) - len(wrote.failed) - len(wrote.refused)} of {len(specs)} members "
                f"submitted; {len(wrote.failed)} could not be written ({brief(wrote.error)}): "
                f"{submitting.some([s.name for s in wrote.failed])}. The others run; these "
                "names are free: submit them again once the bucket answers"
            )
        if wrote.refused:
            raise JobExists(
                f"{len(wrote.refused)} member(s) were taken meanwhile, not submitted: "
                + submitting.some([s.name for s in wrote.refused])
            )
        if not self.expect_daemon:
            return specs
        status = self.daemon_status()
        if status.stopped:
            warnings.warn(NoDaemonWarning(f"the group waits: {status.message}"), stacklevel=2)
        return specs

    def retry_failed(self, group: str) -> list[JobSpec]:
        """Submit again the members of ``group`` that ended FAILED or TIMEOUT (their own
        specs, as new submissions of the same names); the ones resubmitted."""
        members = self.group_members(group)
        if not members:
            raise UnknownJob(f"no group named {group!r} in {self.store.root_url}")
        specs = submitting.failed_again(members)
        return self.submit_group(specs) if specs else []

    def group_members(self, group: str) -> list[JobInfo]:
        """Every member of an array or sweep, active and finished."""
        return [j for j in self.list_jobs(include_completed=True) if j.group == group]

    def daemon_status(self) -> DaemonStatus:
        """Whether a daemon acts on this root, from its lease (``.acting``, ``.message``)."""
        try:
            return daemon_status(self.store)
        except Exception as e:
            return DaemonStatus(None, f"could not read the lease: {brief(e)}")

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

    def _warn_unmarked(self, names: list[str]) -> None:
        """A group's members whose markers failed: submitted, found by the full listing."""
        warnings.warn(
            f"{len(names)} member(s) are submitted but their submission markers could not be "
            f"written ({submitting.some(names, 3)}): the daemon "
            f"finds them by its full listing, within {FULL_LISTING_SECONDS:g}s on a large queue",
            stacklevel=3,
        )

    def _mark(self, name: str) -> None:
        """The submission marker that makes the daemon read this spec next cycle instead of
        finding it by its periodic full listing (bastion/bucket/specwatch.py). The spec is written
        already, so a failure here loses nothing: it only waits longer, as the warning says."""
        try:
            self.store.requests.write_marker(name)
        except Exception as e:
            warnings.warn(
                f"{name} is submitted, but its submission marker could not be written "
                f"({brief(e)}): the daemon finds it by its full listing, within "
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
                raise AlreadyFinished(name, JobState.from_json(record["state"]).display_status)
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
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # one round trip, not three
            spec = pool.submit(quietly(self.store.specs.read), name)
            state = pool.submit(quietly(self.store.states.read), name)
            summary = pool.submit(self.queue)
            job = _active_job(ActiveJob(name, spec.result(), state.result()))
            if job is not None:
                return placed([job], summary.result())[0]
        job = self._completed(name)
        if job is None:
            raise UnknownJob(self._unknown(name))
        return job

    def list_jobs(self, include_completed: bool = False) -> list[JobInfo]:
        """Every job; one whose objects cannot be read or parsed (any bucket writer can put
        anything there) is a row with the reason (``problem``), never an error for the list."""
        with heap.paused(), concurrent.futures.ThreadPoolExecutor(16) as pool:
            summary = pool.submit(self.queue)  # read while the rest is (one request)
            active = read_active(self.store, pool.map)  # the snapshot, and what changed since
            jobs = [job for job in map(_active_job, active) if job is not None]
            if include_completed:
                done = sorted(set(self.store.complete.list()) - {a.name for a in active})
                jobs += [job for job in pool.map(self._completed, done) if job is not None]
            return sorted(placed(jobs, summary.result()), key=lambda j: j.name)

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
        spec, state = quietly(self.store.specs.read)(name), quietly(self.store.states.read)(name)
        return _active_job(ActiveJob(name, spec, state))

    def _completed(self, name: str) -> JobInfo | None:
        try:
            record = self.store.complete.read(name)
            return from_record(name, record) if record is not None else None
        except Exception as e:
            return JobInfo(
                name, None, None, finished=True, problem=f"record unreadable: {brief(e)}"
            )

    # -- outputs (launch/outputs.py) -------------------------------------------------------

    def outputs(
        self, name: str, download: str | None = None, delete: bool = False
    ) -> dict[str, OutputFile]:
        """The job's output files (``ROOT/outputs/NAME/``: worker k's under ``workers/<k>/``)
        by name, with size, time and token. ``download``: also fetch them into that directory
        (only what changed since the last download there). ``delete``: remove them all
        (returns what was there). UnknownJob when no job of that name exists and it has no
        outputs; OutputsError for a ``download`` target that is a file."""
        check_name(name)
        files = _outputs.list_outputs(self.store, name)
        if not files and self._active(name) is None and self._completed(name) is None:
            raise UnknownJob(f"{self._unknown(name)}, and no outputs under that name")
        if download is not None:
            _outputs.download(self.store, name, download)
        if delete:
            self.store.outputs.delete_all(name)
        return files

    def output_summaries(self, name: str) -> list[dict[str, Any]]:
        """What each attempt's syncer restored and synced (one record per attempt and worker)."""
        check_name(name)
        return self.store.outputs.read_summaries(name)

    def history(self, name: str, all_submissions: bool = False) -> list[dict[str, Any]]:
        """This submission's lifecycle events; with ``all_submissions``, every job ever run
        under this name (from ``ROOT/history/jobs/NAME``), the active one's last."""
        if all_submissions:
            check_name(name)
            events = list(self.store.history.read(name))
            active = self._active(name)
            if active and active.state:  # the current run, not archived yet
                events += active.state.events
            if events:
                return events
        info = self.get(name)
        return list(info.state.events) if info.state else []

    def runs(self, name: str) -> list[runs_.Run]:
        """Every run of this name, oldest first (see launch/runs.py): a relaunched name keeps
        its earlier runs' records and output."""
        check_name(name)
        current = self._active(name) or self._completed(name)
        return runs_.runs_of(self.store, name, current)

    def run(self, name: str, which: int) -> runs_.Run:
        """Run ``which`` of this name: 1.. from the oldest, 0 the latest, -1 the one before."""
        try:
            return runs_.pick(self.runs(name), name, which)
        except LookupError as e:
            raise UnknownJob(str(e)) from None

    def iter_run_log(self, name: str, which: int) -> Iterator[bytes]:
        """That run's output only, in pieces of at most LOG_CHUNK bytes."""
        yield from runs_.log_of(self.store, name, self.run(name, which), LOG_CHUNK)

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
        on_poll: Callable[[JobInfo], None] | None = None,
    ) -> Iterator[str]:
        """Yield log text as it is written until the job is finished (launch/follow.py)."""
        from launch.follow import follow_log  # it builds on this module

        return follow_log(self, name, poll_seconds, timeout, no_daemon_timeout, on_poll)

    def wait(self, name: str, poll_seconds: float = 1.0, timeout: float | None = None) -> JobInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get(name)
            if info.finished:
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {name!r} still {info.status} after {timeout}s")
            time.sleep(poll_seconds)


def _active_job(objects: ActiveJob) -> JobInfo | None:
    """An active job from its spec and state as read; None when it has no spec (any more).
    One the snapshot holds as listed comes with its row, and is parsed only if asked."""
    if objects.row and isinstance(objects.spec, bytes) and isinstance(objects.state, bytes):
        try:
            row = JobRow.loads(objects.row)
        except ValueError:  # not a row this code wrote: the spec and state say it
            pass
        else:
            return JobInfo.from_row(objects.name, row, objects.spec, objects.state)
    return parsed(objects.name, objects.spec, objects.state)
