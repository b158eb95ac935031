"""`bastion why NAME`: the policy's explanation, computed from what the daemon decides on.

It reads the same bucket objects the daemon reads (active specs, their states, the quota file,
the usage ledger) and runs the same pure policy, so it works from any machine.
"""

from __future__ import annotations

import concurrent.futures
import time

from bastion.jobspec import JobSpec, SpecError, check_name
from bastion.jobstate import JobState
from bastion.scheduling import job_request
from launch.api import Client, UnknownJob
from quota.config import QuotaConfig, QuotaError, default_quota, parse_quota
from quota.policy import explain
from quota.usage import UsageLedger


def load_quota(client: Client, quota_file: str | None) -> QuotaConfig:
    """The quota file, or the default the daemon uses when there is none."""
    store = client.store
    url = quota_file or store.default_quota_url()
    if store.url_token(url) is not None:
        return parse_quota(store.read_url(url).decode(), source=url)
    info = store.read_daemon_info() or {}
    if not info.get("pool"):
        raise UnknownJob(f"no quota file at {url} and no daemon has run on {store.root_url}")
    return default_quota(info["pool"])


def explain_job(client: Client, name: str, quota_file: str | None = None) -> str:
    check_name(name)
    info = client.get(name)
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
    names = sorted(store.list_specs())
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        specs = list(pool.map(store.read_spec, names))
        states = list(pool.map(store.read_state, names))
    now = time.time()
    requests = []
    for job_name, raw_spec, raw_state in zip(names, specs, states, strict=True):
        if raw_spec is None or raw_state is None:
            continue
        try:
            spec = JobSpec.loads(raw_spec)
        except SpecError:
            continue
        request = job_request(job_name, spec, JobState.loads(raw_state), now)
        if request is not None:
            requests.append(request)
    half_life = config.scheduling.usage_half_life_seconds
    saved = store.read_usage()
    ledger = UsageLedger.from_json(saved) if saved else UsageLedger(half_life, now, {})
    ledger = ledger.advance([r for r in requests if r.phase != "PENDING"], now)
    return explain(config, requests, ledger.by_user, now, name)
