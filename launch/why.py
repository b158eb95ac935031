"""`bastion why NAME`: the policy's explanation, computed from what the daemon decides on.

It reads the same bucket objects the daemon reads (active specs, their states, the quota file,
the usage ledger) and runs the same pure policy, so it works from any machine.
"""

from __future__ import annotations

import concurrent.futures
import time

from bastion.jobspec import JobSpec, SpecError, check_name
from bastion.jobstate import JobState
from bastion.policy_inputs import policy_requests
from launch.api import Client, UnknownJob
from launch.status import humanize_epochs
from quota.config import QuotaConfig, QuotaError, default_quota, parse_quota
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
            return None
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
    check_name(name)
    info = client.get(name)
    if quota_file and client.store.quota.token(quota_file) is None:
        raise QuotaFileMissing(
            f"no quota file at {quota_file}; fix the URL, or leave --quota_file out to use "
            f"the daemon's ({daemon_quota_url(client)})"
        )
    refusal = quota_refusal(client, quota_file)
    text = _explain(client, info, name, quota_file)
    return humanize_epochs(text + (f"\n{refusal}" if refusal else ""))


def _explain(client: Client, info, name: str, quota_file: str | None) -> str:
    if info.finished or info.state is None:
        return f"job {name}: {info.status}" + (f" ({info.reason})" if info.reason else "")
    try:
        config = load_quota(client, quota_file)
    except QuotaError as e:
        return (
            f"job {name}: {info.status} ({info.reason})\nthe quota file is invalid:\n"
            + "\n".join(e.problems)
        )
    store = client.store
    names = sorted(store.specs.list())
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        specs = list(pool.map(store.specs.read, names))
        states = list(pool.map(store.states.read, names))
    now = time.time()
    jobs = []
    for job_name, raw_spec, raw_state in zip(names, specs, states, strict=True):
        if raw_spec is None or raw_state is None:
            continue
        try:
            spec = JobSpec.loads(raw_spec)
        except SpecError:
            continue
        jobs.append((job_name, spec, JobState.loads(raw_state)))
    requests = policy_requests(jobs, now)
    saved = store.usage.read()
    half_life = config.scheduling.usage_half_life_seconds
    ledger = usage_now(UsageLedger.from_json(saved) if saved else None, half_life, requests, now)
    return explain(config, requests, ledger.by_user, now, name) + _where(info)


def _where(info) -> str:
    """Where an admitted job's attempt stands, as its runner last said (waiting for cloud
    capacity or quota, provisioning, which workers are late): the policy admitted it, so the
    rest of its wait is the runner's, and that is what a user asking "why" needs to read."""
    state = info.state
    if state is None or state.status.value == "PENDING" or not info.reason:
        return ""
    workers = f" ({info.worker_summary})" if info.worker_summary else ""
    return f"\n  now: {info.status}{workers}: {info.reason}"
