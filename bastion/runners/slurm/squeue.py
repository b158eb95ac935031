"""What Slurm's commands print, read back: ``squeue`` rows, ``ExitCode=`` fields, the
job-completion file, and a pending job's place in its partition's queue. Pure functions.

Why apart: the parsing is the part that breaks when Slurm's output changes, so it is tested
on its own, and the runner works with :class:`Row` records only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bastion.bucket.runs import parse_run_name
from bastion.bucket.store import ObjectInfo

# squeue's columns: id, name, state, reason, nodes, partition, priority, comment (the comment
# last, since only it may hold the separator).
SQUEUE_FORMAT = "%i|%j|%T|%r|%N|%P|%Q|%k"
_COLUMNS = SQUEUE_FORMAT.count("|") + 1
LIVE = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "RESIZING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
        "STAGE_OUT",
        "SPECIAL_EXIT",
    }
)
QUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
PREEMPTED = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})


@dataclass(frozen=True)
class Row:
    """One job as ``squeue`` lists it."""

    job_id: int
    name: str
    state: str
    reason: str
    nodes: str
    partition: str
    comment: str
    priority: int = 0

    @property
    def live(self) -> bool:
        return self.state in LIVE

    @property
    def queued(self) -> bool:
        return self.state in QUEUED

    def tag(self, key: str) -> str | None:
        """``key=value`` from the comment Bastion wrote."""
        for word in self.comment.split():
            k, sep, v = word.partition("=")
            if sep and k == key:
                return v
        return None


def parse_squeue(text: str) -> list[Row]:
    """The rows of ``squeue -h -o SQUEUE_FORMAT``; lines that are not rows are skipped."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|", _COLUMNS - 1)
        if len(parts) != _COLUMNS or not parts[0].strip().isdigit():
            continue
        job_id, name, state, reason, nodes, partition, priority, comment = parts
        rows.append(
            Row(
                int(job_id),
                name,
                state.split()[0] if state.strip() else "",
                reason,
                nodes,
                partition,
                "" if comment == "(null)" else comment,
                int(priority) if priority.strip().isdigit() else 0,
            )
        )
    return rows


def queue_position(row: Row, everyone: Iterable[Row]) -> int:
    """``row``'s place (1 is next) among the jobs pending in its partition, in Slurm's order:
    higher priority first, then the older (lower) job id. Every user's jobs count, so the
    listing must be of the partition's whole queue, not only Bastion's."""
    ahead = 0
    for other in everyone:
        if other.job_id == row.job_id or not other.queued:
            continue
        if row.partition not in other.partition.split(","):
            continue
        if (other.priority, -other.job_id) > (row.priority, -row.job_id):
            ahead += 1
    return ahead + 1


def exit_code(text: str) -> int | None:
    """Slurm's ``ExitCode=code:signal``: the code, or 128+signal when a signal ended it."""
    code, _, sig = text.strip().partition(":")
    if not code.isdigit():
        return None
    if int(code) == 0 and sig.isdigit() and int(sig):
        return 128 + int(sig)
    return int(code)


def jobcomp(path: str, job_id: int) -> tuple[str, int | None] | None:
    """The last (state, exit code) for ``job_id`` in a ``jobcomp/filetxt`` file."""
    found = None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith(f"JobId={job_id} "):
                    state = re.search(r"\bJobState=(\S+)", line)
                    code = re.search(r"\bExitCode=(\S+)", line)
                    if state:
                        found = (state.group(1), exit_code(code.group(1)) if code else None)
    except OSError:
        return None
    return found


def scontrol_state(text: str) -> tuple[str, int | None]:
    """(JobState, exit code) of one ``scontrol show job -o`` line."""
    state = re.search(r"\bJobState=(\S+)", text)
    code = re.search(r"\bExitCode=(\S+)", text)
    return (state.group(1) if state else "", exit_code(code.group(1)) if code else None)


def workers_of(records: Mapping[str, ObjectInfo]) -> int:
    """How many workers an attempt had, from its agents' record names."""
    return 1 + max((p[0] for r in records if (p := parse_run_name(r))), default=0)
