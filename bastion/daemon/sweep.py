"""The orphan sweep: attempts a runner holds that no live job names are deleted; nothing a
live attempt of any runner holds is touched.
"""

from __future__ import annotations

import logging

from bastion.daemon.context import _PART_OF_ATTEMPT, Context
from bastion.retry import error_text

log = logging.getLogger("bastion.daemon")


def live_attempts(ctx: Context) -> set[str]:
    names = set()
    for job in ctx.jobs.values():
        for record in (job.state.run_attempt, job.state.cleanup_attempt):
            if record is not None and record.name:
                names.add(record.name)
    return names


def sweep(ctx: Context) -> None:
    """Attempts a runner holds that no job's state names (their job ended or was deleted
    while we were down, or a daemon died between an attempt's end and its deletion) are
    orphans: delete them. Asks the runners in use and those the settings configure.

    Whose an item is comes from the runner (labels naming the attempt and the runner
    kind; ``Owned.name`` is the attempt's name), and an item whose attempt is live for
    any runner is never deleted, whichever runner listed it. Defense in depth: nor is an
    item named as a part of a live attempt (``<attempt>-<i>``, ``<attempt>-s<i>``: the
    nodes of a multislice queued resource whose node prefix is its attempt's name),
    should a runner ever list one as its own.
    """
    live = live_attempts(ctx)
    kinds = {ctx.runners.default, *ctx.runners.configured} | {
        r.kind
        for job in ctx.jobs.values()
        for r in (job.state.run_attempt, job.state.cleanup_attempt)
        if r is not None and r.kind
    }
    for kind in sorted(kinds):
        try:
            owned = ctx.runners.get(kind).list_owned()
        except Exception as e:
            log.error("could not list the attempts of runner %s: %s", kind, error_text(e))
            continue
        for item in owned:
            busy = item.name in ctx.deleting or item.name in ctx.deletes_in_pool
            part = _PART_OF_ATTEMPT.sub("", item.name)
            if part != item.name and part in live:
                log.warning(
                    "not deleting %s (listed by runner %s): a part of live attempt %s",
                    item.name,
                    kind,
                    part,
                )
                continue
            if item.name not in live and not busy:
                log.warning("deleting attempt %s: no job of this root names it", item.name)
                ctx.deleting[item.name] = (kind, item.handle)
