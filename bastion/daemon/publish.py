"""What the acting daemon serves, published beside the quota it runs on: the runner kinds it
takes (and which its settings configure) with the options each declares, the pool's resource
types and sizes, and the projects with their members. A client reads it to refuse a typo'd
``--runner``, ``--project_id`` or ``--resources`` at once, before writing the spec, instead of
the job being REJECTED a cycle later (launch/checks.py)."""

from __future__ import annotations

import json
import logging
from typing import Any

from bastion.daemon.context import Context, NotHolding
from bastion.retry import error_text
from bastion.runners.base import known_kinds

log = logging.getLogger("bastion.daemon")

CAPABILITIES_VERSION = 1


def capabilities(ctx: Context) -> dict[str, Any]:
    """The record, from the runners made so far and the quota in force (pure of I/O)."""
    made = {runner.kind: runner for runner in ctx.runners.made()}
    runners: dict[str, dict[str, Any]] = {}
    for kind in known_kinds():
        runner = made.get(kind)
        options = getattr(runner, "accepted_options", None) if runner else None
        runners[kind] = {
            "configured": kind in ctx.runners.configured or kind == ctx.runners.default,
            "options": sorted(options) if options is not None else None,  # None: not checked
        }
    config = ctx.quota.config
    record: dict[str, Any] = {
        "version": CAPABILITIES_VERSION,
        "default_runner": ctx.runners.default,
        "runners": runners,
        "pool": dict(config.pool) if config else None,
        "projects": {p: list(m) for p, m in config.membership.items()} if config else None,
        "quota_file": ctx.quota.url,
        "quota_error": ctx.quota.error,
    }
    return record


def publish_capabilities(ctx: Context) -> None:
    """Write ``ROOT/history/capabilities`` when it changed; a failed write is logged and tried
    again next cycle (a client then checks against the last one, or not at all)."""
    record = capabilities(ctx)
    raw = json.dumps(record, sort_keys=True)
    if raw == ctx.capabilities_written:
        return
    try:
        ctx.may_act()
        ctx.store.capabilities.write(record)
        ctx.capabilities_written = raw
    except NotHolding:
        return  # a standby publishes nothing: the holder's record stands
    except Exception as e:
        log.error("could not publish the daemon's capabilities: %s", error_text(e))
