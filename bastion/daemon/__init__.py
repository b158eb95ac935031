"""The daemon: one cycle lists the bucket, reads what changed, decides, writes, then acts.

Decide, then act. A cycle turns what it sees (spec changes, user requests, runners'
observations, the policy's decisions) into events for the lifecycle table
(:mod:`bastion.lifecycle`), which returns the job's next state and the effects to carry out.
The states are written to the bucket first; only then are the effects (start, stop, delete an
attempt) handed to the effects pool, so every attempt is recorded in the bucket, by name, before
it exists, and a daemon that dies at any moment finds it again. The scheduling loop never waits
on a runner: effects finish in their pool (apart from the pool of the cycle's own requests, so
a burst's starts never hold up the next cycle) and their results are taken in next cycle.

Fencing: every effect first checks that the lease is certainly ours for longer than the effect
can take (see :mod:`bastion.lease`); a daemon that cannot prove it starts nothing and drops
what it knows.

A cycle is cheap when nothing changed: it lists jobs/user_states/ (cancel requests and the
submission markers that name new or replaced specs) and every spec only now and then
(:mod:`bastion.bucket.specwatch`); a spec is re-read only when its token changes, states are written
only when their bytes change, and logs upload only new bytes. Every per-job step is wrapped
so one bad input or one failed call is recorded on that job and never stops the cycle for the
others.

The package, one concern per module (the cycle's steps in the order they run):

- ``loop``: :class:`Daemon`, the loop and the numbered steps of a cycle;
- ``context``: what the steps share (collaborators, jobs in memory, effects in flight);
- ``recovery``: the first cycle's read-back of every state, and the periodic state check;
- ``ingest``: specs and user requests that changed, as lifecycle events;
- ``effects`` (take in): last cycle's effect results; (act): this cycle's effects;
- ``observe``: each live attempt polled through its runner, its output copied;
- ``plan``: the pure policy pass and its decisions;
- ``writeback``: logs, then states (the write-ahead record), usage, the daemon's own log;
- ``archive``: finished jobs whose attempts are gone, to jobs/complete;
- ``sweep``: orphaned attempts deleted;
- ``snapshot``: the shards of every job's spec and state that changed, for a fast restart;
- ``events``: the one way a step feeds the lifecycle table; ``pools``: the thread pools.
"""

from bastion.daemon.context import (
    DECISION_RECORD_BYTES,
    DEFAULT_START_GIVE_UP_SECONDS,
    QUEUE_REASONS_KEPT,
    SWEEP_EVERY_CYCLES,
    CycleReport,
    Job,
    NotHolding,
)
from bastion.daemon.loop import Daemon

__all__ = [
    "DECISION_RECORD_BYTES",
    "DEFAULT_START_GIVE_UP_SECONDS",
    "QUEUE_REASONS_KEPT",
    "SWEEP_EVERY_CYCLES",
    "CycleReport",
    "Daemon",
    "Job",
    "NotHolding",
]
