"""Earlier runs of a name: relaunching a finished name starts a new run, and the earlier
ones stay reachable (their record in ``ROOT/history/runs/<name>/``, their output in the
name's one log between their ``log_start`` and the next run's).

Runs are numbered 1 (the oldest) to N (the latest, which may still be active); ``--run=-1``
is the one before the latest (``--previous``), ``--run=0`` the latest. Runs archived by a
daemon older than this record are not listed (their events are in ``history --all``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bastion.bucket.store import Store
from launch.jobinfo import JobInfo, from_record


@dataclass(frozen=True)
class Run:
    number: int  # 1 = the oldest
    info: JobInfo
    log_end: int | None  # where the next run's output begins; None: the log's end

    @property
    def log_start(self) -> int:
        return self.info.state.log_start if self.info.state else 0


def runs_of(store: Store, name: str, current: JobInfo | None) -> list[Run]:
    """Every run of ``name``, oldest first: the finished ones, then ``current`` (the active
    job, or the latest record) when it is not one of them already."""
    infos = []
    for submission in store.finished_runs.list(name):
        record = store.finished_runs.read(name, submission)
        if record and record.get("state"):
            infos.append(from_record(name, record))
    # In the order the daemon saw them: a record's name sorts by the whole second only, and
    # two runs of a name seen in the same second sorted by their random submission ids
    # (then a run's log ended where it began: empty)
    infos.sort(key=lambda i: (i.state.submit_time or 0.0) if i.state else 0.0)
    seen = {i.state.submission for i in infos if i.state}
    if current is not None and (current.state is None or current.state.submission not in seen):
        infos.append(current)
    runs = []
    for number, info in enumerate(infos, 1):
        following = infos[number] if number < len(infos) else None
        end = following.state.log_start if following and following.state else None
        runs.append(Run(number, info, end))
    return runs


def pick(runs: list[Run], name: str, which: int) -> Run:
    """Run ``which``: 1..N from the oldest, 0 the latest, -1 the one before it, ..."""
    index = which - 1 if which > 0 else len(runs) - 1 + which
    if not runs or not 0 <= index < len(runs):
        have = f"runs 1..{len(runs)}" if runs else "no recorded runs"
        raise LookupError(
            f"{name} has {have} (1 the oldest; 0 the latest; -1 the one before it): there is "
            f"no run {which}"
        )
    return runs[index]


def log_of(store: Store, name: str, run: Run, chunk: int) -> Iterator[bytes]:
    """The run's output: the name's log from its start to the next run's start."""
    position = run.log_start
    for data in store.logs.read_chunks(name, position, chunk):
        if run.log_end is not None and position + len(data) > run.log_end:
            data = data[: max(0, run.log_end - position)]
            if data:
                yield data
            return
        position += len(data)
        yield data
