"""Ingest: specs and user requests that changed become lifecycle events."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from bastion import lifecycle
from bastion.bucket.objects import ObjectInfo, TokenRead
from bastion.bucket.specwatch import MARKERS_PER_LOOK, Look
from bastion.daemon import events
from bastion.daemon.context import Context, Job
from bastion.jobspec import JobSpec, SpecError, name_problem, requester, spec_changes
from bastion.jobstate import JobState, Status
from bastion.retry import error_text
from bastion.runners.base import known_kinds
from bastion.suggest import did_you_mean

log = logging.getLogger("bastion.daemon")
# Marked specs read per cycle: a burst of 20,000 is taken in over cycles of about a second
# each (the rest wait, their markers kept, for the next cycle, which runs at once), so the
# jobs already running are observed in between instead of after one cycle of a minute. As
# many as a look lists markers once a burst is waiting (bastion/bucket/specwatch.py).
INTAKE_PER_CYCLE = MARKERS_PER_LOOK


def read_specs(ctx: Context, look: Look, now: float) -> None:
    """Take in the specs that changed (``to_read``), at most INTAKE_PER_CYCLE, each read
    with its token (or read ahead, bastion/daemon/prefetch.py). With the full listing, jobs
    whose spec is no longer listed are gone; without it, a spec absent now is gone. See
    bastion/bucket/specwatch.py."""
    listed = look.specs
    ready = read_ahead(ctx, look)
    changed, tokens = to_read(ctx, look, ready)
    changed, later = changed[:INTAKE_PER_CYCLE], changed[INTAKE_PER_CYCLE:]
    # the loop runs the next cycle without waiting its poll (markers beyond a ranged look too)
    ctx.intake_backlog = len(later) + look.more_markers
    marked = set(look.markers.values())  # (a marked one left over is named again next look)
    ctx.listed_backlog = {n: tokens.get(n, "") for n in later if n not in marked}
    markers_wait = look.more_markers or len(ctx.listed_backlog) < len(later)
    results = dict(zip(changed, read_all(ctx, changed, ready), strict=True))
    unread = set(later)  # their markers stay, to be taken in next cycle
    for name in changed:
        result = results[name]
        # a token no listing has: the next full listing reads (and rejects) it again
        token = listed[name].token if listed is not None else "?"
        if isinstance(result, ValueError):  # not a regular file, too large: the spec is bad
            ctx.inputs_changed = True
            absorb_spec(ctx, name, b"", token, now, problem=str(result))
            continue
        if isinstance(result, Exception):
            log.error("%s: could not read spec: %s", name, error_text(result))
            unread.add(name)
            if name not in marked:  # (a marked one: its marker stays)
                ctx.listed_backlog[name] = ""
            continue
        if result is None:  # deleted since it was listed or marked
            if listed is None:
                spec_absent(ctx, name, marked=name in look.markers.values())
            continue
        raw, token = result  # the token of the bytes read (a listing's may be older)
        job = ctx.jobs.get(name)
        if job is not None and job.token == token:
            continue  # marked, but what we read last: nothing new
        ctx.inputs_changed = True
        try:
            absorb_spec(ctx, name, raw, token, now)
        except Exception:
            log.exception("%s: could not take in the spec", name)
    if listed is not None:
        for name, job in ctx.jobs.items():
            if name not in listed and job.token and not job.gone_from_bucket:
                job.gone_from_bucket = True
                ctx.attend(job)
                ctx.inputs_changed = True
    ctx.specwatch.taken_in(look, unread)  # its markers are deleted at the cycle's end
    if markers_wait or ctx.listed_backlog:  # the next cycle's reads, while this one goes on
        first = list(ctx.listed_backlog)
        ctx.prefetch.start(ctx.store, ctx.specwatch, ctx.pool, first, INTAKE_PER_CYCLE)


def to_read(
    ctx: Context, look: Look, ready: Mapping[str, TokenRead]
) -> tuple[list[str], dict[str, str]]:
    """The specs that changed, in the order they are taken in, and the tokens a listing gave
    them. With the full listing: those whose token is not their job's (what was read ahead
    first: it is read). Else: what the last full listing left (but what a marker brought in
    since), then the cancel requests' unseen jobs and the marked specs (``intake_order``)."""
    jobs = ctx.jobs
    if look.specs is not None:
        tokens = {n: i.token for n, i in look.specs.items()}
        changed = [n for n, t in tokens.items() if n not in jobs or jobs[n].token != t]
        changed.sort(key=lambda n: n not in ready)
        return changed, tokens
    tokens = ctx.listed_backlog
    left = [n for n, t in tokens.items() if n not in jobs or jobs[n].token != t]
    return list(dict.fromkeys(left + intake_order(ctx, look))), tokens


def read_ahead(ctx: Context, look: Look) -> dict[str, TokenRead]:
    """What the prefetch read that this cycle may take (bastion/daemon/prefetch.py); with
    the full listing, only the reads of the very objects it lists (their tokens)."""
    prefetched = ctx.prefetch.take()
    if prefetched is None:
        return {}
    ready = prefetched.usable(look)
    if look.specs is None:
        return ready
    listed = look.specs
    return {
        n: r
        for n, r in ready.items()
        if isinstance(r, tuple) and n in listed and r[1] == listed[n].token
    }


def read_all(ctx: Context, names: list[str], ready: Mapping[str, TokenRead]) -> list[Any]:
    """Each spec's bytes with the token of the bytes read, a failed read's exception in its
    place: from ``ready`` (what the prefetch read, bastion/daemon/prefetch.py), the rest in
    one call (Objects.read_many_with_token: on GCS one hop into gcsfs's event loop for all
    of them): a burst's marked specs, or what a full listing found changed (after a
    restart, the specs written while no daemon ran)."""
    unready = [name for name in names if name not in ready]
    reads = dict(zip(unready, ctx.store.specs.read_many_with_token(unready, ctx.pool), strict=True))
    return [ready[name] if name in ready else reads[name] for name in names]


def intake_order(ctx: Context, look: Look) -> list[str]:
    """The specs to read, without the full listing: those cancel requests name that the
    daemon has not seen (so the cancel applies), then the marked ones, oldest marker first
    (markers sort by their writer's clock): a burst is taken in in the order it came."""
    unseen = sorted(n for n in look.requests if n not in ctx.jobs and not name_problem(n))
    marked = [look.markers[m] for m in sorted(look.markers)]
    return list(dict.fromkeys(unseen + marked))


def spec_absent(ctx: Context, name: str, marked: bool) -> None:
    """A spec read because a marker or request named it is not there: gone, if we knew
    the job; a marker for a spec never seen is reported (it is deleted all the same)."""
    job = ctx.jobs.get(name)
    if job is not None:
        if not job.gone_from_bucket:
            job.gone_from_bucket = True
            ctx.attend(job)
            ctx.inputs_changed = True
    elif marked:
        log.warning(
            "%s: a submission marker names it but %s is absent (deleted since, or the "
            "marker was written without its spec); nothing to take in",
            name,
            ctx.store.specs.url(name),
        )


def absorb_spec(
    ctx: Context, name: str, raw: bytes, token: str, now: float, problem: str = ""
) -> None:
    job = ctx.jobs.get(name)
    spec, problem = (None, problem) if problem else parse_spec(ctx, name, raw)
    if job is None:  # born: what the table knows of a job before its first event
        job = ctx.jobs[name] = Job(name=name, state=JobState(submit_time=now))
        ctx.born_since_freeze += 1
        ctx.attend(job)
    elif job.token != token:
        ctx.attend(job)  # re-read: its key in the snapshot moved, whatever the spec says
    job.token = token
    job.gone_from_bucket = False
    state = job.state
    if spec is None:
        if job.spec is None and not state.attempt:
            events.apply(ctx, job, lifecycle.Reject(f"spec rejected: {problem}"), now)
        else:
            refused = lifecycle.SpecRefused(
                f"spec update ignored, the job keeps its last good spec: {problem}; "
                f"fix {ctx.store.specs.url(name)}"
            )
            log.error("%s: %s", name, refused.reason)
            events.apply(ctx, job, refused, now)
        return
    if not state.job_identity:
        job.spec = spec
        ctx.index.saw_spec(job)
        detected = lifecycle.Detected(
            spec.identity, spec.digest(), uuid.uuid4().hex[:12], str(spec.metadata.job_id)
        )
        events.apply(ctx, job, detected, now)
        return
    if state.job_identity != spec.identity:
        log.warning("%s: a new submission replaced job %s", name, state.job_identity)
    old, job.spec = job.spec, spec
    ctx.index.saw_spec(job)
    if spec.digest() == state.spec_digest:
        return
    changes = spec_changes(old, spec) if old is not None else []
    owner = (old or spec).metadata.user_id
    what = lifecycle.attributed("spec updated", spec.metadata.updated_by, owner)
    what += f": {', '.join(changes)} changed" if changes else ""
    if state.status is Status.PENDING:
        events.apply(ctx, job, lifecycle.SpecChanged(spec.identity, spec.digest(), what), now)
    elif state.status is Status.ACTIVE and state.run_attempt is not None:
        update = lifecycle.Update(f"{what}; restarting with it", job.grace(ctx.grace_seconds))
        events.apply(ctx, job, update, now)


def parse_spec(ctx: Context, name: str, raw: bytes) -> tuple[JobSpec | None, str]:
    problem = name_problem(name)
    if problem:
        return None, f"file name: {problem}"
    try:
        spec = JobSpec.loads(raw)
    except (SpecError, RecursionError, ValueError, OverflowError) as e:
        return None, str(e)[:500]
    if spec.name != name:
        return None, (
            f"field name: spec says {spec.name[:80]!r} but its file is jobs/active/{name}; "
            "the file name is the job's key, make them equal"
        )
    kind = spec.runner_kind
    if kind is not None and kind not in known_kinds():  # a typo can never start: REJECTED
        return None, (
            f"field runner.kind: {kind!r} is not a runner kind{did_you_mean(kind, known_kinds())}; "
            f"use one of {', '.join(known_kinds())}"
        )
    return spec, ""


def apply_requests(ctx: Context, requests: dict[str, ObjectInfo], now: float) -> None:
    """Requests are deleted once applied, so any that is listed still needs applying."""
    if requests:
        ctx.inputs_changed = True
    for name in requests:
        try:
            apply_request(ctx, name, now)
        except Exception:
            log.exception("%s: could not apply the user request; will retry", name)


def apply_request(ctx: Context, name: str, now: float) -> None:
    try:
        raw = ctx.store.requests.read(name)
    except ValueError as e:  # not a regular file or too large: drop it
        log.warning("%s: deleting an unreadable request: %s", name, error_text(e))
        ctx.store.requests.delete(name)
        return
    if raw is None:
        return
    job = ctx.jobs.get(name)
    try:
        request = json.loads(raw)
        status = str(request.get("status", "")).upper()
    except (ValueError, AttributeError, RecursionError):
        request, status = {}, ""
    target = request.get("job_identity") if isinstance(request, dict) else None
    live = job is not None and job.spec is not None and not job.gone_from_bucket
    if not live or (target and target != job.state.job_identity):
        log.info(
            "%s: deleting a stale request (no such job, or it targets an earlier job of this name)",
            name,
        )
    elif status != "CANCELLING":
        log.warning(
            "%s: ignoring request with status %r (only CANCELLING is understood)",
            name,
            status[:80],
        )
    else:
        why = lifecycle.attributed("cancelled", requester(request), job.spec.metadata.user_id)
        events.apply(ctx, job, lifecycle.Cancel(why, job.grace(ctx.grace_seconds)), now)
    ctx.store.requests.delete(name)
