"""`bastion why NAME`: the policy's explanation, computed from what the daemon decides on.

It reads the same bucket objects the daemon reads (active specs, their states, the quota file,
the usage ledger) and runs the same pure policy, so it works from any machine.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import time

from bastion import heap
from bastion.bucket.snapshot import ActiveJob, read_active
from bastion.jobrow import JobRow, created_at
from bastion.jobspec import JobSpec, SpecError, check_name
from bastion.jobstate import JobState
from bastion.lifecycle import NOT_STARTED
from bastion.policy_inputs import job_request, request
from bastion.quota_source import missing_after_good
from bastion.timelimits import fmt_duration
from launch.api import Client, JobInfo, UnknownJob
from launch.status import humanize_epochs
from quota.config import QuotaConfig, QuotaError, default_quota, parse_quota
from quota.model import JobRequest
from quota.policy import explain
from quota.usage import UsageLedger, usage_now


class QuotaFileMissing(UnknownJob):
    """--quota_file names no object (a typo); one line naming the URL and the fix."""


def daemon_quota_url(client: Client) -> str:
    """The quota file the daemon of this root reads (it publishes it), else the default."""
    try:
        info = client.store.daemon_info.read() or {}
    except Exception:
        info = {}
    return str(info.get("quota_file") or client.store.quota.default_url())


def quota_refusal(client: Client, quota_file: str | None = None) -> str | None:
    """When the quota file the daemon reads is invalid: a message saying that the daemon runs
    on the last good version (ROOT/history/quota-last-good) and why the file was refused.

    The daemon refuses an invalid file and keeps the last good one; the reasons are computed
    here by parsing the current file as the daemon does."""
    store = client.store
    url = quota_file or daemon_quota_url(client)
    try:
        if store.quota.token(url) is None:
            if not store.quota.read_last_good():
                return None  # never had one: the daemon runs 'default' on its pool, as said
            problems = [missing_after_good(url)]
        else:
            parse_quota(store.quota.read(url).decode(), source=url)
            return None
    except QuotaError as e:
        problems = list(e.problems) or [str(e)]
    except (OSError, UnicodeDecodeError) as e:
        problems = [f"unreadable: {e}"]
    try:
        last_good = store.quota.read_last_good()
    except OSError:
        last_good = None
    if last_good:
        head = (
            f"quota: the daemon runs on the last good version "
            f"({store.quota.last_good_url()}); it refused {url}:"
        )
    else:
        head = f"quota: {url} is invalid and there is no last good version; no job starts:"
    return "\n".join([head, *(f"  {p}" for p in problems)])


def load_quota(client: Client, quota_file: str | None) -> QuotaConfig:
    """The quota file, or the default the daemon uses when there is none; the last good
    version when the file is invalid and the daemon kept one (as the daemon does)."""
    store = client.store
    url = quota_file or daemon_quota_url(client)
    if store.quota.token(url) is not None:
        try:
            return parse_quota(store.quota.read(url).decode(), source=url)
        except QuotaError:
            last_good = store.quota.read_last_good()
            if not last_good:
                raise
            return parse_quota(last_good, source="last good quota")
    if not quota_file and (last_good := store.quota.read_last_good()):
        return parse_quota(last_good, source="last good quota")  # as the daemon keeps it
    if quota_file:
        raise QuotaFileMissing(
            f"no quota file at {quota_file}; fix the URL, or leave --quota_file out to use "
            f"the daemon's ({daemon_quota_url(client)})"
        )
    info = store.daemon_info.read() or {}
    if not info.get("pool"):
        raise UnknownJob(f"no quota file at {url} and no daemon has run on {store.root_url}")
    return default_quota(info["pool"])


def explain_job(client: Client, name: str, quota_file: str | None = None) -> str:
    """(Collections paused throughout: it reads and plans the whole queue; see heap.)"""
    with heap.paused():
        return _explain_job(client, name, quota_file)


def _explain_job(client: Client, name: str, quota_file: str | None) -> str:
    check_name(name)
    info = client.get(name)
    if quota_file and client.store.quota.token(quota_file) is None:
        raise QuotaFileMissing(
            f"no quota file at {quota_file}; fix the URL, or leave --quota_file out to use "
            f"the daemon's ({daemon_quota_url(client)})"
        )
    story = _held(info, name) or not_started(info) or _unplanned(info, name)
    with (
        concurrent.futures.ThreadPoolExecutor(16) as pool,
        concurrent.futures.ThreadPoolExecutor(1) as aside,
    ):
        # The whole queue, read while the quota file is (its own requests, in its own thread:
        # ``pool`` takes its reads); only for a job the policy's plan explains.
        queue = None if story else aside.submit(read_active, client.store, pool.map)
        refusal = quota_refusal(client, quota_file)
        text = story or _explain(client, info, name, quota_file, queue, pool)  # type: ignore[arg-type]
    if _never_started(info):  # admitted, but its runner has not started it: not "running"
        text = text.replace(
            _ADMITTED,
            "nothing in the quota: it was admitted, but its runner has not started it (now: below)",
        )
    text += _time_limit(info)
    return humanize_epochs(text + (f"\n{refusal}" if refusal else ""))


def _unplanned(info, name: str) -> str:
    """A job that is not in the policy's input (finished, or not taken in yet): its status."""
    if info.finished or info.state is None:
        return f"job {name}: {info.status}" + (f" ({info.reason})" if info.reason else "")
    return ""


def _held(info, name: str) -> str:
    """A job the daemon holds back before the policy (a dependency, its group's limit): that
    is its whole story until the hold ends."""
    spec, state = info.spec, info.state
    if spec is None or state is None or state.status.value != "PENDING":
        return ""
    if not (spec.after or (spec.group or {}).get("max_running")):
        return ""
    if not state.reason.startswith("waiting for "):
        return ""
    return (
        f"job {name}: PENDING ({state.reason}); the daemon does not offer it to the policy "
        "until then, so it holds no quota"
    )


def _time_limit(info) -> str:
    """``time limit 2h: 1h23m left (ran 37m)``: running time only counts."""
    spec = info.spec
    if spec is None or spec.time_limit is None or info.state is None:
        return ""
    left = info.time_left()
    limit = fmt_duration(spec.time_limit)
    if left is None:
        return f"\n  time limit {limit}"
    used = spec.time_limit - left
    return (
        f"\n  time limit {limit}: {fmt_duration(left)} left (ran {fmt_duration(used)}; time "
        "pending or preempted does not count)"
    )


_ADMITTED = "nothing: it is starting or running"  # quota.explain's words for an admitted job


def _never_started(info) -> bool:
    record = info.state.run_attempt if info.state is not None else None
    return record is not None and record.unstarted and info.state.status.value == "ACTIVE"


def not_started(info) -> str:
    """A job whose runner could not start it and that let go of its quota: what to fix, in
    the runner's own words (they name it), and when it tries again; "" for any other job."""
    state = info.state
    if state is None or info.finished or state.status.value != "PENDING":
        return ""
    if not state.reason.startswith(NOT_STARTED):
        return ""
    kind = (info.spec.runner_kind if info.spec else None) or "the default"
    return (
        f"job {info.name}: PENDING, holding no quota: the {kind} runner {state.reason}\n"
        "  to fix: what the runner's message says, on the daemon's machine; the job then starts "
        f"by itself (or stop it: bastion cancel {info.name})"
    )


def _explain(
    client: Client,
    info,
    name: str,
    quota_file: str | None,
    queue: concurrent.futures.Future[list[ActiveJob]],
    pool: concurrent.futures.ThreadPoolExecutor,
) -> str:
    """The policy's plan for the whole queue (``queue``: being read), explained for ``name``."""
    try:
        config = load_quota(client, quota_file)
    except QuotaError as e:
        return (
            f"job {name}: {info.status} ({info.reason})\nthe quota file is invalid:\n"
            + "\n".join(e.problems)
        )
    usage = pool.submit(client.store.usage.read)  # read while the queue is (one request)
    active = queue.result()  # the snapshot, and what changed since
    now = time.time()
    requests = [r for r in (_request(a, now) for a in active) if r is not None]
    saved = usage.result()
    half_life = config.scheduling.usage_half_life_seconds
    used = UsageLedger.from_json(saved) if saved else None
    ledger = usage_now(used, half_life, requests, now)
    why = explain(config, requests, ledger.by_user, now, name)
    return why + _where(info) + _progress(info, now)


def _request(job: ActiveJob, now: float) -> JobRequest | None:
    """The job as the daemon's policy sees it: from its row (the snapshot's, as listed now),
    else from its spec and state, parsed; None when it holds and wants nothing."""
    if not isinstance(job.spec, bytes) or not isinstance(job.state, bytes):
        return None
    if job.row:
        try:
            row = JobRow.loads(job.row)
            return request(
                job.name,
                row.project_id,
                row.user_id,
                row.resources,
                row.priority,
                created_at(row.creation_time).replace(tzinfo=dt.UTC).timestamp(),
                row.standing,
                now,
            )
        except (ValueError, KeyError, TypeError):  # not a row this code wrote
            pass
    try:
        spec = JobSpec.loads(job.spec)
    except SpecError:
        return None
    return job_request(job.name, spec, JobState.loads(job.state), now)


def _progress(info: JobInfo, now: float) -> str:
    """The job's last checkpoint report ($BASTION_OUTPUT_DIR/.bastion/checkpoint.json): how
    much work a stop would lose."""
    when = info.state.last_checkpoint if info.state is not None else None
    if not when:
        return ""
    age = max(0.0, now - float(when))
    ago = (
        f"{age:.0f} s"
        if age < 120
        else f"{age / 60:.0f} min"
        if age < 7200
        else f"{age / 3600:.1f} h"
    )
    return f"\n  last checkpoint {ago} ago"


def _where(info) -> str:
    """Where an admitted job's attempt stands, as its runner last said (waiting for cloud
    capacity or quota, provisioning, which workers are late): the policy admitted it, so the
    rest of its wait is the runner's, and that is what a user asking "why" needs to read."""
    state = info.state
    if state is None or state.status.value == "PENDING" or not info.reason:
        return ""
    workers = f" ({info.worker_summary})" if info.worker_summary else ""
    return f"\n  now: {info.status}{workers}: {info.reason}"
