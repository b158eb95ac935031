"""Trace files for the simulator: JSON lines, one job each (extra keys ignored).

    {"name": "j1", "project_id": "p1", "user_id": "u1", "submit": 0, "duration": 3600,
     "resources": {"v4": 8}, "priority": 3}

Optional: "checkpoint_every" (seconds > 0: the job checkpoints that often while it runs,
resumes from its last checkpoint after a preemption, and reports it to the policy) and
"checkpoint_phase" (seconds >= 0 after each start to its first checkpoint, default 0).

Every bad line is reported with its line number and field, all at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_PRIORITY = 3


class TraceError(ValueError):
    """An invalid trace; ``problems`` names each line and field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class TraceJob:
    name: str
    project_id: str
    user_id: str
    submit: float  # seconds from the start of the trace
    duration: float  # running time the job needs (progress is lost on preemption)
    resources: Mapping[str, int]
    priority: int = DEFAULT_PRIORITY
    checkpoint_every: float | None = None  # None: never checkpoints (restarts from scratch)
    checkpoint_phase: float = 0.0  # first checkpoint this long after each start

    def last_checkpoint(self, start: float, t: float) -> float | None:
        """The time of the attempt's last checkpoint by t (started at `start`), or None."""
        every = self.checkpoint_every
        first = start + self.checkpoint_phase
        if every is None or t < first:
            return None
        return first + math.floor((t - first) / every) * every


def parse_trace(text: str, source: str = "<trace>") -> list[TraceJob]:
    """Parse JSON lines into jobs; blank lines and lines starting with '#' are skipped."""
    jobs: list[TraceJob] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}:{no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{where}: must be a JSON object, got {type(obj).__name__}")
            continue
        job, errs = _job(obj)
        problems += [f"{where}: field {e}" for e in errs]
        if job is None:
            continue
        if job.name in seen:
            problems.append(f"{where}: field name: {job.name!r} repeats line {seen[job.name]}")
            continue
        seen[job.name] = no
        jobs.append(job)
    if problems:
        raise TraceError(problems)
    return jobs


def _job(obj: dict[str, Any]) -> tuple[TraceJob | None, list[str]]:
    errs: list[str] = []

    def text(key: str) -> str:
        v = obj.get(key)
        if not isinstance(v, str) or not v:
            errs.append(f"{key}: must be a non-empty string, got {v!r}")
            return ""
        return v

    def seconds(key: str, positive: bool) -> float:
        v = obj.get(key)
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (positive and v == 0):
            errs.append(
                f"{key}: must be a number of seconds {'> 0' if positive else '>= 0'}, got {v!r}"
            )
            return 0.0
        return float(v)

    name, project, user = text("name"), text("project_id"), text("user_id")
    submit, duration = seconds("submit", False), seconds("duration", True)
    res = obj.get("resources")
    resources: dict[str, int] = {}
    if not isinstance(res, dict):
        errs.append(f'resources: must be an object like {{"v4": 8}}, got {res!r}')
    else:
        for r, n in res.items():
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                errs.append(f"resources.{r}: must be a whole number >= 0, got {n!r}")
            else:
                resources[r] = n
    prio = obj.get("priority", DEFAULT_PRIORITY)
    if not isinstance(prio, int) or isinstance(prio, bool) or not 1 <= prio <= 5:
        errs.append(f"priority: must be a whole number from 1 (highest) to 5, got {prio!r}")
    every = seconds("checkpoint_every", True) if "checkpoint_every" in obj else None
    phase = seconds("checkpoint_phase", False) if "checkpoint_phase" in obj else 0.0
    if errs:
        return None, errs
    return TraceJob(name, project, user, submit, duration, resources, prio, every, phase), []
