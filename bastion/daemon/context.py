"""What every step of a cycle shares: the daemon's collaborators (store, runners, quota, lease,
log sync), the jobs in memory, the pools, and the bookkeeping of effects and deletions in
flight. The steps (events, ingest, observe, plan, writeback, effects, archive, sweep, recovery)
are functions of this context; the loop (bastion.daemon.loop) runs them in order."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from bastion import lifecycle
from bastion.bucket.logs import daemon_log_name
from bastion.bucket.logsync import LogSync
from bastion.bucket.specwatch import SpecWatch
from bastion.bucket.store import Store
from bastion.daemon.jobindex import JobIndex
from bastion.daemon.prefetch import Prefetch
from bastion.daemon.statebytes import squeeze, unsqueeze
from bastion.jobspec import JobSpec
from bastion.jobstate import JobState, Status
from bastion.lease import Lease
from bastion.policy_inputs import job_request, timeless
from bastion.quota_source import QuotaSource
from bastion.runners.instances import Runners
from bastion.status.publisher import PagePublisher
from bastion.usage.ledger import LedgerWriter
from quota.model import JobRequest
from quota.queue_memo import QueueMemo

log = logging.getLogger("bastion.daemon")
DEFAULT_GRACE_SECONDS = 30.0
DEFAULT_START_GIVE_UP_SECONDS = 600.0
START_RETRY_FIRST_SECONDS = 1.0
START_RETRY_MAX_SECONDS = 60.0
DECISION_RECORDS_KEPT = 1000
DECISION_RECORD_BYTES = 8 << 10  # one record's decisions; the rest of a burst is counted
OUTPUT_CHUNK = 8 << 20  # bytes of one attempt's output copied per read
REPLAN_SECONDS = 30.0  # a quiet queue's pass runs at least this often (decayed usage moves)
# ... and on a large queue at most once per this per job held: a pass costs about 15 us a job,
# so a quiet queue's passes take at most 1% of a core (100,000 jobs: every 150 s, not 30 s;
# the times a decision depends on, such as a minimum runtime's end, still replan on time).
REPLAN_SECONDS_PER_JOB = 0.0015
# A time threshold (a waiting job's reclaim delay ends, a runner's minimum runtime) replans
# no sooner than this per job held after the last pass. After a burst each job's own delay
# ends at its own moment: 100,000 jobs taken in over 5 minutes replanned every cycle for the
# next 4 (0.6 s a pass, 23% of a core measured while nothing else changed). At 100,000 jobs a
# threshold is honoured within 20 s (against delays of minutes); below 15,000, within a 3 s
# poll, as before. (Given the plan, replan_by now skips the crossings that cannot change it:
# the burst's delays and agings; this still bounds the rest, such as a burst of starts each
# reaching its minimum runtime.)
THRESHOLD_SECONDS_PER_JOB = 0.0002
QUEUE_NAMES_KEPT = 1000  # per project in the queue summary: its size stays bounded
QUEUE_REASONS_KEPT = 50  # full (volatile) wait reasons per project in the queue summary
_PART_OF_ATTEMPT = re.compile(r"-s?\d+$")  # an attempt name ends -a<N>[c]: never matched
SWEEP_EVERY_CYCLES = 20  # orphaned attempts are looked for this often (and at recovery)
# Whole-queue checks (recovery.upkeep) at most once per this per job held: a check costs about
# 50 us of CPU per job (a serialization, a listing entry), so at most 1% of a core whatever the
# queue's size; at 100,000 jobs a foreign write or a missed mark is found within 500 s.
QUEUE_CHECK_SECONDS_PER_JOB = 0.005
DELETE_WAIT_SECONDS = 300.0
MAX_SPEC_ENV_BYTES = 64 << 10  # the spec rides in an environment variable only below this
DAEMON_LOG_SYNC_SECONDS = 10.0  # the daemon's own log (diagnostics) in the bucket
USAGE_SAVE_SECONDS = 60.0  # the usage ledger: a crash loses at most this much of its accrual


@dataclass(slots=True)
class Job:
    """What the daemon holds in memory about one job between cycles."""

    name: str
    state: JobState
    spec: JobSpec | None = None
    token: str = ""  # listing token of the spec we last read
    squeezed: bytes = b""  # the state bytes last written (or read): ``written``, compressed
    state_token: str | None = None  # token of the state object we wrote/read; None: absent
    # (tuples, not lists: an empty one is shared, where a list would cost 56 bytes a job)
    attempted: tuple[bytes, ...] = ()  # writes not yet confirmed
    gone_from_bucket: bool = False
    effects: tuple[lifecycle.Effect, ...] = ()  # decided, not yet carried out
    inflight: int = 0  # effects handed to the pool whose results are not taken in yet
    pending_log: tuple[tuple[str, str], ...] = ()  # lines a full disk refused
    spec_json: tuple[JobSpec | None, str] = (None, "")  # the spec, serialized for its env
    reason_before_blind: str | None = None  # the reason before its attempt could not be watched
    # the policy's view of the job (policy_request), built from exactly this state and spec:
    # kept while neither is replaced (the table replaces a state on every change)
    request: JobRequest | None = None
    request_state: JobState | None = None  # (two slots, not a tuple: 56 bytes a job less)
    request_spec: JobSpec | None = None

    @property
    def written(self) -> bytes:
        """The state's bytes as last written to (or read from) the bucket (b"": none)."""
        return unsqueeze(self.squeezed)

    @written.setter
    def written(self, raw: bytes) -> None:
        self.squeezed = squeeze(raw)

    def policy_request(self, now: float) -> JobRequest | None:
        """What the policy sees of this job (``job_request``), remembered: building it for
        every waiting job took half of each policy pass (10,000 jobs: 0.14 of 0.28 s), and
        a waiting job's view changes only with its state or spec. Not remembered while the
        view depends on ``now`` (no submit time yet, or running without a start time)."""
        if self.request_state is self.state and self.request_spec is self.spec:
            return self.request
        request = job_request(self.name, self.spec, self.state, now)
        if timeless(self.state):
            self.request, self.request_state, self.request_spec = request, self.state, self.spec
        return request

    def grace(self, default: float) -> float:
        """Seconds between the stop's warning and SIGKILL: the job's own ``grace_seconds``
        when its spec gives one, else ``default`` (the daemon's, or the quota file's)."""
        chosen = self.spec.grace_seconds if self.spec is not None else None
        return default if chosen is None else chosen

    def quiet(self) -> bool:
        """A pending job with nothing under way: no attempt, stop, effect or unwritten change,
        its spec in the bucket. Most of a large queue is quiet, and no step of a cycle but the
        policy pass has anything to do for a quiet job (Context.attention)."""
        state = self.state
        return (
            state.status is Status.PENDING
            and state.run_attempt is None
            and state.cleanup_attempt is None
            and state.stop is None
            and not self.effects
            and not self.inflight
            and not self.gone_from_bucket
            and not self.pending_log
            and self.reason_before_blind is None
            and not self.unwritten()
        )

    def unwritten(self) -> bool:
        """True when the state differs from what the bucket holds. Only a state marked changed
        since its last write is serialized to find out: a quiet cycle serializes nothing."""
        if not self.state.changed:
            return False
        if self.state.dumps() != self.written:
            return True
        self.state.mark_written()
        return False


def replan_period(jobs: int) -> float:
    """Seconds a quiet queue of ``jobs`` keeps its plan (REPLAN_SECONDS_PER_JOB)."""
    return max(REPLAN_SECONDS, jobs * REPLAN_SECONDS_PER_JOB)


def threshold_gap(jobs: int) -> float:
    """Seconds after a pass before a time threshold alone replans (THRESHOLD_SECONDS_PER_JOB)."""
    return jobs * THRESHOLD_SECONDS_PER_JOB


@dataclass
class CycleReport:
    seconds: float = 0.0
    ops: dict[str, int] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step of the cycle
    planned: bool = False  # the policy pass ran (a quiet cycle keeps the last plan)

    def slowest(self, count: int = 3) -> str:
        top = sorted(self.phases.items(), key=lambda kv: -kv[1])[:count]
        return ", ".join(f"{name} {seconds:.2f}s" for name, seconds in top)


@dataclass
class SnapshotBook:
    """What the daemon last wrote (or read at recovery) of each snapshot shard, and when it
    writes the changed ones next (bastion/daemon/snapshot.py)."""

    signatures: dict[int, int] = field(default_factory=dict)  # shard -> hash of its keys
    rowless: set[int] = field(default_factory=set)  # read without rows (version 1): rewritten
    due: float = 0.0
    # Which shards the next visit looks at, so that a quiet queue costs nothing (a job's key
    # changes only while it is attended): jobs that left the attention set since the last
    # visit (gone quiet or away, at a cycle's end), the keys of the jobs attended then (one
    # attended now with another key changed), and shards to write again (a failed write).
    touched: set[str] = field(default_factory=set)
    seen: dict[str, tuple[str, str, str] | None] = field(default_factory=dict)
    again: set[int] = field(default_factory=set)
    inflight: concurrent.futures.Future[None] | None = None
    changes: int = 0  # Context.job_changes at the last cycle's end: a cycle's changes
    early: bool = False  # this period's write came early (after a settled burst)


class NotHolding(Exception):
    """The lease is not certainly ours: nothing may be started or stopped."""


class Context:
    """The state of one daemon, shared by the steps of its cycles."""

    def __init__(
        self,
        store: Store,
        runners: Runners,
        work_dir: str,
        quota: QuotaSource,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        max_workers: int = 48,
        lease: Lease | None = None,
        start_give_up_seconds: float = DEFAULT_START_GIVE_UP_SECONDS,
    ) -> None:
        self.store = store
        self.start_give_up_seconds = start_give_up_seconds
        # (job, purpose) -> (failed tries, when the next is due) of starts that failed
        # transiently: each job backs off on its own (bastion/lifecycle.py gives up).
        self.start_retries: dict[tuple[str, str], tuple[int, float]] = {}
        self.lease = lease
        self.runners = runners
        self.quota = quota
        self.grace_seconds = grace_seconds
        self.logs = LogSync(store, os.path.join(work_dir, "logs"))
        self.daemon_log = daemon_log_name(socket.gethostname(), os.path.abspath(work_dir))
        self.jobs: dict[str, Job] = {}
        self.index = JobIndex()  # the few jobs a pass looks at apart (kept as jobs change)
        # The jobs a step may have work for this cycle (an ordered set): every job that is not
        # quiet (Job.quiet). events.apply adds the job it changes; the cycle's end drops the
        # ones gone quiet; so an idle cycle's steps cost what is under way, not the queue.
        self.attention: dict[str, None] = {}
        # Grows whenever a job's state or spec is replaced (attend) or a job comes or goes:
        # what the status page compares to know its jobs changed without a pass over them.
        self.job_changes = 0
        # Archived jobs' statuses as their records say, for the jobs that wait for them
        # (bastion/daemon/gates.py): read once each, forgotten when a name is archived again.
        self.finished_status: dict[str, str | None] = {}
        self._init_intake(store)
        self.born_since_freeze = 0  # jobs taken in since the last heap.settle
        self.queue_checked_at = float("-inf")  # the last whole-queue check (recovery.upkeep)
        self.snapshots = SnapshotBook()  # ROOT/history/snapshot/: bastion/daemon/snapshot.py
        self.daemon_log_synced_at = -DAEMON_LOG_SYNC_SECONDS  # the first sync is at once
        self.usage_saved_at = -USAGE_SAVE_SECONDS
        self.usage_unsaved = False
        self.ledger = LedgerWriter()  # attempts' records in ROOT/usage/ (bastion usage)
        self.page: PagePublisher | None = PagePublisher(store)  # ROOT/status/ (None: off)
        self.page_queue: tuple[str, dict[str, Any] | None] = ("", None)  # summary, parsed
        self.cycles = 0
        self.decision_records = 0
        self._init_effects(max_workers)
        self.stop = threading.Event()
        self.lost_ownership = False
        self.recovered = False
        self.info: dict[str, Any] = {}  # published to ROOT/history/daemon when we start acting
        self.queue_written = ""  # the queue summary last written (without its time)
        self.capabilities_written = ""  # what ROOT/history/capabilities last said
        # The policy pass runs when a job changed, the quota file did, or a time threshold of
        # the last plan passed (quota.policy.replan_by); a quiet cycle skips it.
        self.inputs_changed = True
        self.planned_config: Any = None
        self.replan_at = 0.0
        self.queue_memo = QueueMemo()  # each project's queue of the last pass, for the next

    def attend(self, job: Job) -> None:
        """``job`` may need a step's work (it changed): every step that skips quiet jobs
        looks at it."""
        self.attention[job.name] = None
        self.job_changes += 1

    def attending(self) -> list[Job]:
        """The jobs that may need a step's work (a copy: a step may change what it holds)."""
        jobs = self.jobs
        return [job for name in list(self.attention) if (job := jobs.get(name)) is not None]

    def settle_attention(self) -> None:
        """At a cycle's end: jobs that went quiet or away leave the attention set (and are
        noted for the snapshot: their key may have changed while they were attended)."""
        jobs, kept, left = self.jobs, {}, self.snapshots.touched
        for name in self.attention:
            job = jobs.get(name)
            if job is not None and not job.quiet():
                kept[name] = None
            else:
                left.add(name)
        self.attention = kept

    def _init_intake(self, store: Store) -> None:
        """What ingest.read_specs reads, and what it left for the next cycles."""
        self.specwatch = SpecWatch(store)  # which specs each cycle reads (markers, listing)
        self.intake_backlog = 0  # specs left for the next cycle, which runs at once
        # Specs a full listing found changed, beyond one cycle's intake: no marker names them,
        # so the next cycles read them by name, not the next full listing
        self.listed_backlog: dict[str, str] = {}  # name -> the token the listing gave
        self.prefetch = Prefetch()  # a burst's next specs, read while this cycle goes on

    def _init_effects(self, max_workers: int) -> None:
        """The pools and the books of effects in flight, results to take in, and deletes."""
        # Two pools: the cycle's own requests (spec reads, watches, write-backs) must not queue
        # behind the effects handed off by the last cycle (a burst's 1,000 starts kept the next
        # cycle's watches waiting 2 s), and effects must not wait for a cycle's requests.
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers, "bastion-io")
        self.effects_pool: concurrent.futures.ThreadPoolExecutor | None = None  # at first use
        self.workers = max_workers
        # Effect results to take in: an event, or None (the batch is done).
        self.effect_results: list[tuple[str, lifecycle.Event | None]] = []
        self.results_lock = threading.Lock()
        self.deleting: dict[str, tuple[str, dict[str, Any] | None]] = {}  # name -> kind, handle
        self.deletes_in_pool: set[str] = set()  # handed to the pool, results not taken in
        # attempt name -> (its job, since when): the job is finalized once it is gone
        self.deletes_of: dict[str, tuple[str, float]] = {}
        self.deleted: list[tuple[str, str, dict[str, Any] | None]] = []  # verified gone
        self.undeleted: list[tuple[str, str, dict[str, Any] | None]] = []  # from the pool
        self.futures: set[concurrent.futures.Future[None]] = set()  # effects in flight

    def may_act(self) -> None:
        """Before every effect. The lease's validity already ends a margin (a quarter of its
        term) before a standby may take over; that margin bounds one effect's duration (and
        the runners' fencing token covers an effect that outlasts it)."""
        if self.lost_ownership or (self.lease is not None and not self.lease.valid()):
            raise NotHolding
