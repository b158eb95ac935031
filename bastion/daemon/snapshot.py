"""Snapshot: now and then, the shards of ``history/snapshot/`` whose jobs changed are written
again (bastion/bucket/snapshot.py says what a shard holds and why a reader can trust it).

A restart then reads the shards and only the specs and states whose listed tokens differ from
theirs: at 100,000 jobs, 64 reads and two paged listings instead of 200,000 reads. A shard is
rewritten only when one of its jobs changed (its spec or state token), so a quiet queue writes
nothing and a busy one what changed, at most once per ``SNAPSHOT_SECONDS`` (and once more
right after a burst has settled, so that the readers of the queue find it there).

Nor does a quiet queue cost a visit of every job: a job's key changes only while the job is
attended (every change attends it, Context.attend), so a visit looks only at the shards of
jobs that left the attention set since the last one and of attended jobs whose key moved
(SnapshotBook.touched, .seen). At 100,000 jobs with 20 running, a visit found nothing and
took 1.1 s of CPU every 100 s, now nothing; the shards it does look at are checked whole.

The loop collects what to write (references to bytes it already holds; no serialization);
a thread of the effects pool encodes and writes it, so a cycle never waits on it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable

from bastion.bucket.snapshot import SHARDS, Entry, encode, shard_of
from bastion.daemon import effects
from bastion.daemon.context import Context, Job, SnapshotBook
from bastion.daemon.statebytes import unsqueeze
from bastion.jobrow import StateSummary
from bastion.jobrow import encode as encode_row
from bastion.jobspec import JobSpec
from bastion.retry import error_text

log = logging.getLogger("bastion.daemon")

SNAPSHOT_SECONDS = 30.0
# ... and on a large queue at most once per this per job held: finding the changed shards
# visits every job (about 10 us each), so at 100,000 jobs every 100 s, 1% of a core. A restart
# after a kill -9 reads what changed since (a clean stop writes the snapshot first).
SNAPSHOT_SECONDS_PER_JOB = 0.001

# A burst (an intake, a sweep ending) is written once it has settled, not when due: this
# many jobs gone quiet since the last visit, and at most this many changes in the last cycle.
SETTLED_BURST_JOBS = 1000
SETTLED_CHANGES = 100

Key = tuple[str, str, str]  # what makes a shard's content: name, spec token, state token
# name, spec, spec token, state token, state bytes (squeezed), and what the row takes of the state
Member = tuple[str, JobSpec | None, str, str, bytes, StateSummary]


def known(book: SnapshotBook, keys: Iterable[Key], now: float) -> None:
    """At recovery: the shards as read, so only those that differ are written again (and
    those an older daemon wrote without rows)."""
    by_shard: dict[int, set[Key]] = defaultdict(set)
    for k in keys:
        by_shard[shard_of(k[0])].add(k)
    book.signatures = {
        shard: hash(frozenset(ks)) for shard, ks in by_shard.items() if shard not in book.rowless
    }
    book.due = now + SNAPSHOT_SECONDS
    book.touched, book.again = set(), set(book.rowless)


def baseline(ctx: Context) -> None:
    """At recovery, once the jobs are loaded: the keys of the jobs attended now, the ones a
    later visit compares (the others are quiet, as known() saw them)."""
    ctx.snapshots.seen = {job.name: key(job) for job in ctx.attending()}


def key(job: Job) -> Key | None:
    """The job's key in the snapshot; None when the bucket may not hold what we hold (a state
    not yet written, or a write whose answer is not in): such a job is read at a restart."""
    if job.state_token is None or not job.squeezed or job.attempted or job.unwritten():
        return None
    return (job.name, job.token if job.spec is not None else "", job.state_token)


def changed_shards(ctx: Context, book: SnapshotBook) -> set[int]:
    """The shards a job may have changed in since the last visit (see the module's
    docstring); the keys of the jobs attended now are kept for the next one."""
    shards = {shard_of(name) for name in book.touched} | book.again
    seen: dict[str, Key | None] = {}
    for job in ctx.attending():
        k = seen[job.name] = key(job)
        if k != book.seen.get(job.name):
            shards.add(shard_of(job.name))
    book.touched, book.seen, book.again = set(), seen, set()
    return shards


def dirty_shards(
    ctx: Context, book: SnapshotBook, among: set[int] | None = None
) -> dict[int, tuple[int, list[Member]]]:
    """The shards (of ``among``; None: all) whose content differs from what was last
    written: signature and members."""
    by_shard: dict[int, list[tuple[Key, Job]]] = defaultdict(list)
    for job in ctx.jobs.values():
        shard = shard_of(job.name)
        if among is not None and shard not in among:
            continue
        k = key(job)
        if k is not None:
            by_shard[shard].append((k, job))
    dirty: dict[int, tuple[int, list[Member]]] = {}
    for shard in range(SHARDS) if among is None else sorted(among):
        members = by_shard.get(shard, [])
        signature = hash(frozenset(k for k, _ in members))
        if book.signatures.get(shard, hash(frozenset())) == signature:
            continue
        dirty[shard] = (
            signature,
            [
                (k[0], job.spec, k[1], k[2], job.squeezed, StateSummary.of(job.state))
                for k, job in members
            ],
        )
    return dirty


def maybe_write(ctx: Context, now: float) -> None:
    """Every SNAPSHOT_SECONDS (longer on a large queue): the changed shards, written in the
    background; sooner after a burst has settled (``settled_burst``)."""
    book = ctx.snapshots
    changes, book.changes = ctx.job_changes - book.changes, ctx.job_changes
    if book.inflight is not None and not book.inflight.done():
        return
    if now < book.due:
        if not settled_burst(book, changes, ctx.intake_backlog):
            return
        book.early = True  # (the write when due comes as it would have)
    else:
        book.due = now + max(SNAPSHOT_SECONDS, len(ctx.jobs) * SNAPSHOT_SECONDS_PER_JOB)
        book.early = False
    changed = changed_shards(ctx, book)
    if not changed:
        return  # no job's key moved: nothing to visit
    dirty = dirty_shards(ctx, book, changed)
    if dirty:
        book.inflight = effects.submit(ctx, write_shards, ctx, book, dirty)


def settled_burst(book: SnapshotBook, changes: int, backlog: int) -> bool:
    """Whether to write before the snapshot is due: SETTLED_BURST_JOBS jobs have gone quiet
    since the last visit, the cycle just run changed at most SETTLED_CHANGES and no spec
    waits to be taken in (``backlog``: an intake goes on over many cycles) (pure).

    Until the snapshot holds them, every reader of the queue reads each such job's spec and
    state: `bastion list` right after a 20,000-job intake read 40,000 objects (54 s on the
    latency model) for up to 30 s (100 s at 100,000 jobs). Once per period at most, so a
    queue that churns without pause pays no more than twice the writes."""
    if book.early or backlog or changes > SETTLED_CHANGES:
        return False
    return len(book.touched) >= SETTLED_BURST_JOBS


def write_now(ctx: Context, timeout: float = 10.0) -> None:
    """At a clean stop, while the lease is ours: the changed shards, written before we let
    go, so the next daemon reads nothing but the snapshot. A stop waits at most ``timeout``
    for them (a bucket that does not answer must not hold it: a restart then reads more)."""
    book = ctx.snapshots
    if not ctx.recovered or ctx.lost_ownership:
        return
    deadline = time.monotonic() + timeout
    if book.inflight is not None:
        concurrent.futures.wait([book.inflight], timeout=timeout)
    dirty = dirty_shards(ctx, book)
    if not dirty:
        return
    writer = threading.Thread(target=write_shards, args=(ctx, book, dirty), daemon=True)
    writer.start()
    writer.join(max(0.0, deadline - time.monotonic()))
    if writer.is_alive():
        log.warning("the snapshot was not written within %gs of the stop", timeout)


def write_shards(
    ctx: Context, book: SnapshotBook, dirty: dict[int, tuple[int, list[Member]]]
) -> None:
    for shard, (signature, members) in sorted(dirty.items()):
        try:
            ctx.store.snapshot.write(shard, _encode(members))
        except Exception as e:  # written again next time: only a restart's reads depend on it
            log.warning("snapshot shard %02d not written: %s", shard, error_text(e))
            book.again.add(shard)
            continue
        book.signatures[shard] = signature


def _encode(members: list[Member]) -> bytes:
    return encode(
        (name, _entry(spec, spec_token, state_token, state, summary))
        for name, spec, spec_token, state_token, state, summary in members
    )


def _entry(
    spec: JobSpec | None, spec_token: str, state_token: str, squeezed: bytes, summary: StateSummary
) -> Entry:
    state = unsqueeze(squeezed)
    if spec is None:
        return Entry(spec_token, state_token, state)
    return Entry(spec_token, state_token, state, spec.dumps(), encode_row(spec, summary))
