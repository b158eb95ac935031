"""Publish: hand the status page what the cycle holds; it renders off the cycle's path
(``bastion.status.publisher``). Costs the cycle one pass over job references when due and a
job changed since the last page."""

from __future__ import annotations

import json
import logging

from bastion.daemon.context import Context, Job
from bastion.jobstate import Status
from bastion.status.data import Job as PageJob
from bastion.status.publisher import NOTED_OUTCOMES

log = logging.getLogger("bastion.daemon")


def offer_page(ctx: Context, now: float) -> None:
    if ctx.lost_ownership or ctx.page is None:
        return
    records, ctx.ledger.appended = ctx.ledger.appended, []
    if ctx.queue_written != ctx.page_queue[0]:
        ctx.page_queue = (
            ctx.queue_written,
            json.loads(ctx.queue_written) if ctx.queue_written else None,
        )
    jobs = ctx.jobs

    def listed() -> list[PageJob]:  # only when a job changed since the last page
        return [(j.name, j.spec, j.state) for j in jobs.values()]

    ctx.page.offer(ctx.cycles, ctx.job_changes, listed, ctx.page_queue[1], records, now)


def note_finished(ctx: Context, job: Job) -> None:
    """A job archived as failed or rejected: the page lists it even if it never ran."""
    state = job.state
    if (
        ctx.page is None
        or state.status is not Status.COMPLETED
        or state.outcome not in NOTED_OUTCOMES
    ):
        return
    meta = job.spec.metadata if job.spec else None
    ctx.page.note_finished(
        job.name,
        meta.project_id if meta else "?",
        meta.user_id if meta else "?",
        state.outcome.value,
        state.reason,
        float(state.end_time or state.submit_time or 0.0),
    )
