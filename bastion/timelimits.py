"""Time limits, as Slurm's ``--time``: how a limit is written, and how much of it a job used.

Pure: no I/O, time is an argument. A job's time counts only while an attempt runs (from the
runner's first RUNNING to the attempt's end), summed over the attempts of one submission, so
time spent pending, provisioning or preempted never counts (``JobState.ran_seconds`` keeps the
ended attempts' share).
"""

from __future__ import annotations

import re

from bastion.jobstate import JobState
from bastion.spec_errors import SpecError, show

MAX_TIME_LIMIT = 365 * 86400.0  # a year: past it a typo is likelier than a plan
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SUFFIXED = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_SBATCH = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
FORMS = "2h, 90m, 1h30m, 45s, 1d, or sbatch's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"


def parse_time_limit(text: str, where: str = "--time") -> float:
    """Seconds in a limit written as Slurm's sbatch takes it (``30`` is minutes, ``1:30:00``,
    ``1-00:00:00``) or with units (``2h``, ``90m``, ``1h30m``). SpecError names ``where`` and
    the forms it takes."""
    value = text.strip().lower() if isinstance(text, str) else ""
    seconds = _suffixed(value) if value and value[-1] in _UNITS else _sbatch(value)
    if seconds is None:
        raise SpecError(f"{where}: {show(text)} is not a time limit; write e.g. {FORMS}")
    return check_time_limit(seconds, where)


def check_time_limit(seconds: object, where: str = "field time_limit") -> float:
    """A limit in seconds: a positive number no larger than a year."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise SpecError(f"{where}: expected seconds (a number), got {show(seconds)}")
    if not 0 < seconds <= MAX_TIME_LIMIT:
        raise SpecError(
            f"{where}: {show(seconds)} seconds is out of range; give more than 0 and at most "
            f"{MAX_TIME_LIMIT:.0f} (a year)"
        )
    return float(seconds)


def _suffixed(value: str) -> float | None:
    match = _SUFFIXED.fullmatch(value)
    if not match or not any(match.groups()):
        return None
    return float(sum(int(n) * _UNITS[u] for n, u in zip(match.groups(), "dhms", strict=True) if n))


def _sbatch(value: str) -> float | None:
    match = _SBATCH.fullmatch(value)
    if not match:
        return None
    days, first, second, third = match.groups()
    parts = [int(p) for p in (first, second, third) if p is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = [*parts, 0, 0][:3]
        return float(int(days) * 86400 + hours * 3600 + minutes * 60 + seconds)
    if len(parts) == 1:  # MM
        return float(parts[0] * 60)
    if len(parts) == 2:  # MM:SS
        return float(parts[0] * 60 + parts[1])
    return float(parts[0] * 3600 + parts[1] * 60 + parts[2])  # HH:MM:SS


def time_used(state: JobState, now: float) -> float:
    """Seconds this submission has run: ended attempts plus the running one so far."""
    running = max(0.0, now - state.running_since) if state.running_since is not None else 0.0
    return float(state.ran_seconds or 0.0) + running


def time_left(limit: float | None, state: JobState, now: float) -> float | None:
    """Seconds before the limit (never below 0); None without a limit."""
    if limit is None:
        return None
    return max(0.0, limit - time_used(state, now))


def fmt_duration(seconds: float) -> str:
    """``1d2h``, ``1h23m``, ``4m10s``, ``12s``: the two largest units, for a column."""
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size or (unit == "s" and not parts):
            parts.append(f"{whole // size}{unit}")
            whole %= size
        if len(parts) == 2:
            break
    return "".join(parts)
