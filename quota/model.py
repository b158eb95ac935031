"""Inputs and outputs of the policy: jobs as the scheduler sees them, decisions, plans."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol


class Phase(StrEnum):
    """Where a job is, as far as capacity is concerned."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    # Being stopped (preempted or cancelled): still holds its resources, is a candidate for
    # nothing. Its capacity is earmarked for within-quota jobs waiting on a reclaim.
    RELEASING = "RELEASING"


@dataclass(frozen=True, slots=True)
class JobRequest:
    name: str
    project_id: str
    user_id: str
    resources: Mapping[str, int]
    priority: int  # 1 highest .. 5
    submit_time: float  # seconds (epoch or simulated)
    phase: Phase = Phase.PENDING
    start_time: float | None = None  # start of the current attempt (RUNNING/RELEASING)
    tier: int | None = None  # tier it runs on (RUNNING/RELEASING)
    # RELEASING after a preemption: the job that reclaimed (Decision.preempted_by). That job
    # keeps its turn while this one stops, so the reclaim is never redone with new victims.
    preempted_by: str | None = None
    # When the spec was created (the user's clock): breaks ties between jobs the daemon
    # first saw in the same cycle (submit_time, the daemon's clock, stays the first key).
    creation_time: float | None = None
    # RUNNING jobs started as backfill (Decision.backfill_for, stored by the daemon with the
    # job's state): the waiting jobs whose held capacity it took. Any of them that is still
    # pending may preempt it at once (no minimum runtime; inside its project regardless of
    # priority) when it can start.
    backfill_for: tuple[str, ...] = ()
    # How many earlier attempts of this job were preempted. Jobs preempted twice or more are
    # chosen as victims last and never started as backfill (at most three preemptions).
    preemptions: int = 0
    # PENDING: when this attempt became pending (the submit, or the requeue after a
    # preemption); None means submit_time. A backfill job is taken back early only by a job
    # of its backfill_for that has been waiting since before the backfill started.
    pending_since: float | None = None
    # RUNNING: epoch seconds of the last checkpoint the job reported (None: never reported).
    # Among victims of equal standing the policy takes the one that loses the least work:
    # the most recent checkpoint (or, without one in this attempt, the latest start).
    last_checkpoint: float | None = None


class Verdict(StrEnum):
    START = "START"  # start it on `tier`
    KEEP = "KEEP"  # running (or releasing) job: nothing new; record `tier` if it changed
    PREEMPT = "PREEMPT"  # stop a RUNNING job: SIGTERM, grace, SIGKILL; requeued afterwards
    WAIT = "WAIT"  # pending job stays pending; `reason` says why
    REJECT = "REJECT"  # pending job can never run as submitted; `reason` says why


class Decision(NamedTuple):
    """What the pass decided for one job. A named tuple (immutable, compared by value): a
    pass makes one for each of up to 50,000 waiting jobs, and a frozen dataclass costs ten
    times as much to make."""

    name: str
    verdict: Verdict
    reason: str  # human readable, in absolute units
    tier: int | None = None  # for START/KEEP
    preempted_by: str | None = None  # for PREEMPT: the job that needed the room
    # for START: started as backfill in capacity held for these waiting jobs (the daemon
    # stores it as the job's JobRequest.backfill_for while it runs)
    backfill_for: tuple[str, ...] = ()
    # for WAIT: the kind of wait and what it waits on, without the queue position, free
    # capacity or usage in ``reason`` (which change whenever any other job moves). The daemon
    # stores this in the job's state, so a job's state changes only when its wait does.
    wait: str = ""
    ahead: int = 0  # for WAIT: jobs ahead of it in its project's queue


class Waiting(Protocol):
    """Makes the WAIT decisions a pass left to be made on reading (see Decisions)."""

    def decision(self, name: str) -> Decision: ...

    def wait_text(self, name: str) -> str | None: ...

    def by_wait(self, made: Mapping[str, Decision]) -> dict[str | None, list[str]]: ...

    def leading(
        self, project: str, names: Sequence[str], made: Mapping[str, Decision]
    ) -> list[Decision]: ...


class Decisions(Mapping[str, Decision]):
    """Plan.decisions: the Decision of every input job, in input order.

    A pass over 50,000 pending jobs leaves most of them waiting for capacity, or behind a
    job of their project, with a reason that jobs of their shape share but for the queue
    position. `made` holds the decisions made in the pass (every other one); those left
    are made by `waiting` when read (the same Decision every time, from the final state of
    the pass). `wait_text` answers what the daemon compares (the stable wait) without
    making the decision."""

    __slots__ = ("_made", "_names", "_waiting")

    def __init__(
        self, names: Sequence[str], made: Mapping[str, Decision], waiting: Waiting | None = None
    ) -> None:
        self._names, self._made, self._waiting = names, made, waiting

    def __getitem__(self, name: str) -> Decision:
        d = self._made.get(name)
        if d is not None:
            return d
        if self._waiting is None:
            raise KeyError(name)
        return self._waiting.decision(name)

    def __contains__(self, name: object) -> bool:
        if name in self._made:
            return True
        return (
            self._waiting is not None
            and isinstance(name, str)
            and self._waiting.wait_text(name) is not None
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def wait_text(self, name: str) -> str | None:
        """What a waiting job's state stores (Decision.wait, else its reason); None if the
        job does not wait."""
        d = self._made.get(name)
        if d is not None:
            return (d.wait or d.reason) if d.verdict is Verdict.WAIT else None
        return None if self._waiting is None else self._waiting.wait_text(name)

    def by_wait(self) -> dict[str | None, list[str]]:
        """Every job by its ``wait_text`` (None: it does not wait; no order is promised
        among the names of one text). The daemon compares each stored wait with its text
        after every pass: in groups, a waiting job costs a set lookup (at 100,000 waiting
        jobs, 0.02 s against 0.07 s for a pair per job, and 0.14 s for ``wait_text`` name
        by name)."""
        if self._waiting is None:
            return _grouped((n, self.wait_text(n)) for n in self._names)
        return self._waiting.by_wait(self._made)

    def leading(self, project: str, names: Sequence[str]) -> list[Decision]:
        """The decisions of ``names``, the first waiting jobs of ``project`` in queue order
        (Plan.first_waits)."""
        if self._waiting is None:
            return [self[n] for n in names]
        return self._waiting.leading(project, names, self._made)

    def made(self, verdict: Verdict) -> list[Decision]:
        """The decisions with this verdict made in the pass, in input order (all of them
        for every verdict but WAIT)."""
        made = self._made
        return [d for n in self._names if (d := made.get(n)) is not None and d.verdict is verdict]


@dataclass(frozen=True)
class Plan:
    """One decision per input job, RELEASING jobs included (as KEEP with a "releasing" reason).

    ``reserved`` maps a waiting within-quota job to the free capacity held for it this pass
    (not lent to later jobs); ``free`` is what is left after the plan; ``usage`` and
    ``quotas`` are per project in absolute units, with the plan applied (starts added,
    preempted jobs removed); ``within_quota`` names the pending jobs that fit their
    project's guaranteed quota; ``waiting`` lists each project's waiting jobs in queue order
    (a job's Decision.ahead is its index there).
    """

    decisions: Mapping[str, Decision]
    reserved: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    free: Mapping[str, int] = field(default_factory=dict)
    usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    quotas: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    within_quota: frozenset[str] = frozenset()
    waiting: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # What of time the plan depends on, beyond the running jobs' minimum runtimes (see
    # policy.replan_by): its aged head, if it has one (a job that ages later is younger, and
    # never takes its place), and when the reclaim delays its waiting jobs wait out end.
    aged_head: str | None = None
    delays_end: tuple[float, ...] = ()

    def _with(self, verdict: Verdict) -> list[Decision]:
        if verdict is not Verdict.WAIT and isinstance(self.decisions, Decisions):
            return self.decisions.made(verdict)  # (no need to make the waits)
        return [d for d in self.decisions.values() if d.verdict is verdict]

    def wait_text(self, name: str) -> str | None:
        """What a waiting job's state stores (Decision.wait, else its reason), without
        making its Decision; None if it does not wait."""
        if isinstance(self.decisions, Decisions):
            return self.decisions.wait_text(name)
        d = self.decisions.get(name)
        return (d.wait or d.reason) if d is not None and d.verdict is Verdict.WAIT else None

    def by_wait(self) -> dict[str | None, list[str]]:
        """Every job by its ``wait_text`` (None: it does not wait), in bulk: see
        Decisions.by_wait."""
        if isinstance(self.decisions, Decisions):
            return self.decisions.by_wait()
        return _grouped((n, self.wait_text(n)) for n in self.decisions)

    def first_waits(self, project: str, count: int) -> list[Decision]:
        """The decisions of the first ``count`` jobs waiting in ``project``, in queue order
        (the queue summary's), made without those of every waiting job."""
        names = self.waiting.get(project, [])[:count]
        if isinstance(self.decisions, Decisions):
            return self.decisions.leading(project, names)
        return [self.decisions[n] for n in names]

    def starts(self) -> list[Decision]:
        return self._with(Verdict.START)

    def preemptions(self) -> list[Decision]:
        return self._with(Verdict.PREEMPT)

    def waits(self) -> list[Decision]:
        return self._with(Verdict.WAIT)

    def rejects(self) -> list[Decision]:
        return self._with(Verdict.REJECT)


def _grouped(pairs: Iterable[tuple[str, str | None]]) -> dict[str | None, list[str]]:
    """(name, text) pairs as text -> names, in the order they came."""
    groups: dict[str | None, list[str]] = {}
    for name, text in pairs:
        groups.setdefault(text, []).append(name)
    return groups
