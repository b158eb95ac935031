"""``bastion status --html``: the daemon's status page, built here from the root's objects, for
a user who cannot reach the bucket's web view (or a root whose daemon is down).

It reads what the daemon would hold (active specs and their states), the queue summary the
policy pass published, the last week of the usage ledger and the queue-length samples of the
daemon's own page, and renders the same page with absolute links to the logs.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from bastion.bucket.snapshot import read_active
from bastion.bucket.store import Store
from bastion.jobspec import JobSpec, SpecError
from bastion.jobstate import JobState
from bastion.status.data import WEEK, Job, page_data
from bastion.status.html import render
from bastion.usage.report import read_attempts
from launch.status import daemon_status


def read_jobs(store: Store) -> list[Job]:
    """Every active job with a state (from the snapshot and what changed since); a spec that
    does not parse shows as unknown (None)."""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        active = read_active(store, pool.map)
    jobs: list[Job] = []
    for job in active:
        if job.state is None or isinstance(job.state, Exception):
            continue
        try:
            jobs.append((job.name, _spec(job.spec), JobState.loads(job.state)))
        except (ValueError, TypeError):
            continue
    return jobs


def _spec(raw: bytes | Exception | None) -> JobSpec | None:
    try:
        return JobSpec.loads(raw) if isinstance(raw, bytes) else None
    except (SpecError, ValueError):
        return None


def build_page(store: Store, now: float | None = None) -> tuple[str, dict[str, Any]]:
    now = time.time() if now is None else now
    earlier = store.reports.read_page_data() or {}
    data = page_data(
        root_url=store.root_url,
        jobs=read_jobs(store),
        queue=store.queue.read(),
        attempts=list(read_attempts(store, now - WEEK, now).values()),
        queue_lengths=earlier.get("queue_lengths") or [],
        daemon=daemon_status(store, now).message,
        now=now,
        log_link=lambda name: store.reports.log_link(name, relative=False),
    )
    return render(data), data
