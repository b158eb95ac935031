"""A job as a user sees it (``JobInfo``: its spec and state, or why they cannot be read),
and how the daemon's queue summary places a waiting one ("3rd of 120 waiting in default")."""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bastion.jobspec import JobSpec, SpecError, shorten
from bastion.jobstate import JobState, Status
from bastion.timelimits import time_left
from quota.capacity import fmt_units


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
    standing: str = ""  # a running job's place when its project is over quota (see placed)

    @property
    def workers(self) -> list[str]:
        """Each worker's health of a running multi-host attempt ("running", "late", "lost",
        "exit 0", "preempted", "waiting"), as the daemon last saw it; [] otherwise. Not while
        the runner says the attempt is queued or provisioning: the workers it last saw then are
        from before (WORKERS "4/4 running" beside REASON "provisioning: node CREATING")."""
        if self.state is None or self.state.status is not Status.ACTIVE:
            return []
        record = self.state.run_attempt
        if record is None or record.phase not in (None, "RUNNING"):
            return []
        return list(record.workers or ())

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
        if self.state.status is Status.ACTIVE and self.standing:
            return f"now {self.standing}; {self.state.reason}"  # first: the row is cut at 90
        return self.state.reason

    @property
    def group(self) -> str | None:
        """The array or sweep this job is a member of (None: none)."""
        return str((self.spec.group or {}).get("name")) if self.spec and self.spec.group else None

    def time_left(self, now: float | None = None) -> float | None:
        """Seconds of running time left before its time limit (None: no limit, or ended)."""
        if self.spec is None or self.spec.time_limit is None or self.state is None:
            return None
        if self.state.status is Status.COMPLETED:
            return None
        return time_left(self.spec.time_limit, self.state, time.time() if now is None else now)

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
            for key in ("time_limit", "after", "group"):
                if getattr(self.spec, key):
                    data[key] = getattr(self.spec, key)
            left = self.time_left()
            if left is not None:
                data["time_left"] = round(left, 1)
        if self.workers:
            data["workers"] = self.workers
        data["state"] = self.state.to_json() if self.state else None
        data["reason"] = self.reason  # as `bastion list` shows it, uncut
        if self.problem:
            data["problem"] = self.problem
        return data


def brief(error: BaseException) -> str:
    """An exception as one bounded line for a row of `bastion list`."""
    return shorten(f"{type(error).__name__}: {error}".replace("\n", " "), 200)


def from_record(name: str, record: dict[str, Any]) -> JobInfo:
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


def placed(jobs: list[JobInfo], summary: Mapping[str, Any]) -> list[JobInfo]:
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
            where[str(name)] = f"{ordinal(i + 1)}{total} waiting in {project}"
    free = summary.get("free")
    tail = ""
    if isinstance(free, Mapping) and free:
        with contextlib.suppress(TypeError, ValueError):  # a foreign summary: no tail
            tail = f"; {fmt_units(free, zeros=True)} free in the pool"
    going = _first_to_go(projects)
    placed = []
    for job in jobs:
        pending = job.state is not None and job.state.status is Status.PENDING
        if pending and job.name in where:
            job = replace(job, queue=where[job.name] + tail, live_reason=live.get(job.name, ""))
        elif job.state is not None and job.state.status is Status.ACTIVE:
            job = replace(job, standing=_standing(job, going))
        placed.append(job)
    return placed


def _first_to_go(projects: Mapping[str, Any]) -> dict[str, set[str]]:
    out = {}
    for project, entry in projects.items():
        names = entry.get("first_to_go") if isinstance(entry, Mapping) else None
        if isinstance(names, list):
            out[str(project)] = {str(n) for n in names}
    return out


def _standing(job: JobInfo, going: Mapping[str, set[str]]) -> str:
    """A running job's label said when it started ("within quota", "borrowing idle
    capacity"); when its project is over quota now, say whether a reclaim takes it first."""
    project = job.spec.metadata.project_id if job.spec else None
    if project not in going or job.state is None:
        return ""
    if job.name in going[project]:
        return f"borrowing: among the first a reclaim takes from {project}"
    if "borrowing idle capacity" in job.state.reason:
        return f"within {project}'s quota: others of {project} go first when owners reclaim"
    return ""


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
