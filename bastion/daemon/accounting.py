"""Accounting: the attempts that started or ended this cycle, appended to the usage ledger
(``bastion.usage.ledger``) by write-back, just before the states that say so are written."""

from __future__ import annotations

import time

from bastion.daemon.context import Context


def record_attempts(ctx: Context) -> None:
    """Records for the jobs whose state changed (all jobs on the first pass and each new
    day), then one append. A failed append keeps its records for the next cycle; the states
    are written regardless (the ledger never holds a job back)."""
    if ctx.lost_ownership:
        return
    now = time.time()
    jobs = ctx.jobs.values()
    ctx.ledger.collect(
        ((j.name, j.spec, j.state) for j in ctx.attending() if j.state.changed),
        ((j.name, j.spec, j.state) for j in jobs),
        now,
    )
    ctx.ledger.flush(ctx.store, now)
