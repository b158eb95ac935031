"""A job as a user sees it (``JobInfo``: its spec and state, or why they cannot be read),
and how the daemon's queue summary places a waiting one ("3rd of 120 waiting in default").

A job listed from the snapshot comes with its row (bastion/jobrow.py): what a listing shows
of it is answered from the row, and its spec and state bytes are parsed only when something
asks for ``spec`` or ``state`` (a running job's workers, a time limit, a place in the queue).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _quoted  # json.dumps of a str
from typing import Any

from bastion.bucket.store import UnacceptableObject
from bastion.jobrow import JobRow, created_at, spec_fields
from bastion.jobspec import JobSpec, SpecError, shorten
from bastion.jobstate import JobState, Status
from bastion.timelimits import time_left
from quota.capacity import fmt_units

# (A member's ``.value`` goes through the enum's descriptor: read 100,000 times by a list of
# 20,000 jobs, the constants save 0.04 s of it.)
_PENDING, _ACTIVE = Status.PENDING.value, Status.ACTIVE.value

_ROW_FIELDS = ("project_id", "user_id", "resources", "priority")  # a row holds them apart


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
    row: JobRow | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(cls, name: str, row: JobRow, spec: bytes, state: bytes) -> JobInfo:
        """A job listed from the snapshot: its row now, its spec and state parsed if asked."""
        info = cls.__new__(cls)
        info.name, info.row, info._raw = name, row, (spec, state)
        return info

    def __getattr__(self, attr: str) -> Any:
        """``spec`` and ``state`` of a job made ``from_row``: parsed on first use."""
        raw = self.__dict__.get("_raw")
        if raw is None or attr not in ("spec", "state"):
            raise AttributeError(attr)
        job = parsed(self.name, *raw)
        del self.__dict__["_raw"]
        self.spec, self.state = (job.spec, job.state) if job is not None else (None, None)
        self.problem = job.problem if job is not None else ""
        return self.__dict__[attr]

    @property
    def _listed(self) -> JobRow | None:
        """The row, while nothing has needed the parsed spec and state."""
        return self.row if "_raw" in self.__dict__ else None

    def shown(self, key: str) -> Any:
        """A field of the spec as `bastion list --json` shows it (None: no readable spec)."""
        row = self._listed
        if row is not None:
            return getattr(row, key) if key in _ROW_FIELDS else row.spec.get(key)
        return spec_fields(self.spec).get(key) if self.spec is not None else None

    @property
    def phase(self) -> str | None:
        """The lifecycle status (PENDING, ACTIVE, COMPLETED); None before the daemon's."""
        row = self._listed
        if row is not None:
            return row.phase
        return self.state.status.value if self.state is not None else None

    @property
    def log_start(self) -> int:
        """Where this run's output starts in the name's log (> 0: the name ran before)."""
        if self._listed is not None:
            return self._listed.log_start
        return self.state.log_start if self.state is not None else 0

    @property
    def workers(self) -> list[str]:
        """Each worker's health of a running multi-host attempt ("running", "late", "lost",
        "exit 0", "preempted", "waiting"), as the daemon last saw it; [] otherwise. Not while
        the runner says the attempt is queued or provisioning: the workers it last saw then are
        from before (WORKERS "4/4 running" beside REASON "provisioning: node CREATING")."""
        if self._listed is not None and self._listed.phase != _ACTIVE:
            return []
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
        if self._listed is not None:
            return self._listed.status
        if self.state:
            return self.state.display_status
        return "UNREADABLE" if self.problem else "SUBMITTED"

    @property
    def reason(self) -> str:
        if self.problem:
            return self.problem
        row = self._listed
        if row is None and self.state is None:
            return "waiting for the daemon to pick it up"
        reason = row.reason if row is not None else self.state.reason  # type: ignore[union-attr]
        phase = self.phase
        if phase == _PENDING and self.live_reason:
            return self.live_reason
        if phase == _PENDING and self.queue:
            return f"{reason}; {self.queue}"
        if phase == _ACTIVE and self.standing:
            return f"now {self.standing}; {reason}"  # first: the row is cut at 90
        return reason

    @property
    def group(self) -> str | None:
        """The array or sweep this job is a member of (None: none)."""
        if self._listed is not None:
            return self._listed.group
        return str((self.spec.group or {}).get("name")) if self.spec and self.spec.group else None

    def time_left(self, now: float | None = None) -> float | None:
        """Seconds of running time left before its time limit (None: no limit, or ended)."""
        if self._listed is not None and not self._listed.timed:
            return None
        if self.spec is None or self.spec.time_limit is None or self.state is None:
            return None
        if self.state.status is Status.COMPLETED:
            return None
        return time_left(self.spec.time_limit, self.state, time.time() if now is None else now)

    def to_json(self) -> dict[str, Any]:
        """One object per job, fields named as in the spec and the state."""
        data: dict[str, Any] = {"name": self.name, "status": self.status}
        if self.spec:
            data.update(spec_fields(self.spec))
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

    def json_text(self) -> str:
        """``to_json()`` as JSON text. A job listed from its row that shows neither workers nor
        a time left is written from the row, with its state's bytes as they are (same fields,
        the state's keys sorted): no parse."""
        row = self._listed
        if row is not None and row.phase != _ACTIVE and not row.timed:
            state = self.__dict__["_raw"][1]
            if state.startswith(b"{"):
                text = row.spec_json()  # (version 3: as printed, copied undecoded)
                if text.startswith("{") and text.endswith("}") and text[1:-1].strip():
                    head = f'{{"name": {_quoted(self.name)}, "status": {_quoted(row.status)}'
                    reason = _quoted(self.reason)
                    return f'{head}, {text[1:-1]}, "state": {state.decode()}, "reason": {reason}}}'
        return json.dumps(self.to_json())


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
    if info._listed is None:
        if info.spec is None:
            return 0.0
        start = info.spec.metadata.creation_time
    else:
        try:
            start = created_at(info._listed.creation_time)
        except (KeyError, ValueError):  # a row that is not ours
            return 0.0
    now = now or dt.datetime.now(dt.UTC).replace(tzinfo=None)
    return (now - start).total_seconds()


def parsed(name: str, spec: Any, state: Any) -> JobInfo | None:
    """An active job from its spec and state as read (bytes, None, or the exception reading
    raised); None when it has no spec (any more)."""
    info_spec, problem = None, ""
    if spec is None:
        return None
    try:
        if isinstance(spec, Exception):
            raise spec
        info_spec = JobSpec.loads(spec)
    except (SpecError, UnacceptableObject) as e:
        problem = f"spec rejected: {e}"  # as the daemon will reject it
    except Exception as e:
        problem = f"spec unreadable: {brief(e)}"
    info_state = None
    try:
        if isinstance(state, Exception):
            raise state
        info_state = JobState.loads(state) if state else None
    except Exception as e:
        problem = problem or f"state unreadable: {brief(e)}"
    return JobInfo(name, info_spec, info_state, problem=problem)


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
        if job.phase == _PENDING and job.name in where:
            job = _with(job, queue=where[job.name] + tail, live_reason=live.get(job.name, ""))
        elif job.phase == _ACTIVE:
            job = _with(job, standing=_standing(job, going))
        placed.append(job)
    return placed


def _with(job: JobInfo, **changes: str) -> JobInfo:
    """A copy with these fields changed; a job listed from its row stays unparsed (a
    dataclass ``replace`` would read, so parse, its spec and state)."""
    changed = copy.copy(job)
    for name, value in changes.items():
        setattr(changed, name, value)
    return changed


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
