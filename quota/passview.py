"""What the steps of one policy pass share: the interface the pass (``quota.engine``) offers to
its parts (``within``, ``reclaim``, ``reasons``).

The parts read the pass's snapshot and record decisions through it (the reclaim step, which
``within`` also consults, is handed to it directly). Typing them against this
protocol instead of the engine's private class keeps the import graph a tree: the engine
imports its parts, and no part imports the engine back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from quota.capacity import Capacity
from quota.config import SchedulingKnobs
from quota.model import Decision, JobRequest, Verdict

if TYPE_CHECKING:
    from quota.within import Within


class PassView(Protocol):
    """The pass as its parts see it (attributes are the pass's working state)."""

    jobs: Sequence[JobRequest]
    now: float
    knobs: SchedulingKnobs
    pool: Mapping[str, int]
    cap: Capacity
    decisions: dict[str, Decision]
    usage: dict[str, dict[str, int]]  # project -> units held (running, started, releasing)
    fresh: dict[str, dict[str, int]]  # project -> units started in this pass
    earmark: dict[str, int]  # capacity of releasing jobs kept for within-quota jobs
    reclaimers: set[str]  # jobs named by releasing jobs as their preemptor
    reserved: dict[str, dict[str, int]]
    waits: dict[str, tuple[str, object]]  # job -> (kind, detail) of why it waits
    started: set[str]
    held_total: dict[str, int]
    reason_cache: dict[object, str]
    head: str | None
    head_project: str | None
    anchored: dict[str, list[JobRequest]]  # pending job -> backfill running in its capacity
    pending_project: dict[str, str]
    pending_need: dict[str, Mapping[str, int]]
    order: dict[str, list[str]]  # project -> its waiting jobs in queue order
    queues: dict[str, list[JobRequest]]  # project -> its valid pending jobs in queue order
    zero_need: set[str]  # projects with valid pending jobs that need nothing
    # project -> its first job from which on (in queue order) the jobs that nothing let
    # start still need their "behind" marks (set when lending stops early)
    tail_from: dict[str, str]
    first: Within | None  # the within-quota step, when lending stopped early (see waiting)

    def quota(self, project: str) -> Mapping[str, float]: ...

    def proj_usage(self, project: str) -> dict[str, int]: ...

    def eligible(self, j: JobRequest) -> bool: ...

    def decide(
        self,
        job: JobRequest,
        verdict: Verdict,
        reason: str,
        tier: int | None = None,
        by: str | None = None,
    ) -> None: ...

    def anchored_usage(self, name: str, project: str) -> dict[str, int]: ...

    def start(self, j: JobRequest, backfill_for: tuple[str, ...] = ()) -> None: ...
