"""Reading the usage ledger and summing it: what ``bastion usage`` prints and the page shows.

Reading touches only ``ROOT/usage/<day>/`` objects of the days in the window (never a job's
history). Records of one attempt are merged by id; an attempt counts for the part of
``[start, end]`` inside ``[since, until]`` (an attempt still open counts up to ``until`` or
now, whichever is first). Resource-hours are the attempt's resources times those hours;
borrowed ones are those of attempts the policy admitted beyond their project's quota;
hours lost to preemption run from the attempt's start, or its last reported checkpoint, to
the preemption.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bastion.bucket.store import Store
from bastion.usage.ledger import utc_day
from bastion.usage.records import END, OPEN

BY = ("project", "user", "resource")
DAY_SECONDS = 86400.0


@dataclass(frozen=True)
class Attempt:
    """One attempt as the ledger knows it: ``end`` None while it is open."""

    id: str
    job: str
    project: str
    user: str
    resources: Mapping[str, int]
    tier: int | None
    start: float
    end: float | None = None
    outcome: str | None = None
    preempted: bool = False
    checkpoint: float | None = None
    reason: str = ""
    borrowed: bool = False  # admitted beyond its project's quota

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> Attempt:
        return cls(
            id=str(r["id"]),
            job=str(r.get("job", "")),
            project=str(r.get("project", "")),
            user=str(r.get("user", "")),
            resources=dict(r.get("resources") or {}),
            tier=r.get("tier"),
            start=float(r["start"]),
            end=float(r["end"]) if r.get("kind") == END else None,
            outcome=r.get("outcome"),
            preempted=bool(r.get("preempted")),
            checkpoint=float(r["checkpoint"]) if r.get("checkpoint") is not None else None,
            reason=str(r.get("reason") or ""),
            borrowed=bool(r.get("borrowed")),
        )


def merge(
    records: Iterable[Mapping[str, Any]], into: dict[str, Attempt] | None = None
) -> dict[str, Attempt]:
    """Attempts by id: an ``end`` record wins over ``open`` ones; the tier and borrowing an
    ``open`` record saw fill in an ``end`` that lost them. Unreadable records are skipped.
    ``into``: attempts merged so far, updated in place (the page adds each cycle's records).

    Records are chosen as dicts first and made Attempts once per id: a month's ledger is
    hundreds of thousands of lines."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for r in records:
        kind = r.get("kind")
        if kind != END and kind != OPEN:
            continue
        rid = r.get("id")
        known = chosen.get(rid)  # type: ignore[arg-type]
        if known is None:
            chosen[rid] = r  # type: ignore[index]
            continue
        final, other = (r, known) if kind == END and known.get("kind") != END else (known, r)
        if (final.get("tier") is None and other.get("tier") is not None) or (
            other.get("borrowed") and not final.get("borrowed")
        ):
            final = {
                **final,
                "tier": final.get("tier") if final.get("tier") is not None else other.get("tier"),
                "borrowed": bool(final.get("borrowed") or other.get("borrowed")),
            }
        chosen[rid] = final  # type: ignore[index]
    attempts: dict[str, Attempt] = {} if into is None else into
    for rid, r in chosen.items():
        try:
            attempt = Attempt.from_record(r)
        except (KeyError, TypeError, ValueError):
            continue
        known_attempt = attempts.get(rid)
        if known_attempt is not None:  # merged before (the page's running view)
            final_attempt = known_attempt if known_attempt.end is not None else attempt
            attempt = dataclasses.replace(
                final_attempt,
                tier=known_attempt.tier if known_attempt.tier is not None else attempt.tier,
                borrowed=known_attempt.borrowed or attempt.borrowed,
            )
        attempts[rid] = attempt
    return attempts


def parse_lines(raw: bytes) -> list[dict[str, Any]]:
    """The object's records: parsed as one JSON array (fast); line by line when a line does
    not parse (a torn last line of an append cut short: the rest stands)."""
    lines = [line for line in raw.split(b"\n") if line.strip()]
    try:
        records = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return [r for r in records if isinstance(r, dict)]


def read_attempts(store: Store, since: float, until: float) -> dict[str, Attempt]:
    """Every attempt the ledger records in the days ``since``..``until`` (UTC)."""
    first, last = utc_day(since), utc_day(until)
    index = store.reports.usage_index()
    names = [(day, name) for day in index if first <= day <= last for name in index[day]]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        blobs = list(pool.map(lambda dn: store.reports.read_usage_object(*dn), names))
    return merge(record for raw in blobs for record in parse_lines(raw))


def overlap(start: float, end: float, since: float, until: float) -> float:
    return max(0.0, min(end, until) - max(start, since))


@dataclass
class Row:
    """One key's sums (a project, a project's user, or a resource type), in seconds of each
    resource (resource-seconds: count x seconds)."""

    key: tuple[str, ...]
    attempts: int = 0
    preempted: int = 0
    used: dict[str, float] = field(default_factory=dict)
    borrowed: dict[str, float] = field(default_factory=dict)
    lost: dict[str, float] = field(default_factory=dict)

    def add(self, into: dict[str, float], resources: Mapping[str, int], seconds: float) -> None:
        for resource, count in resources.items():
            into[resource] = into.get(resource, 0.0) + count * seconds

    def cost(self, prices: Mapping[str, float] | None) -> float | None:
        if not prices:
            return None
        return sum(prices.get(r, 0.0) * s / 3600.0 for r, s in self.used.items())


def summarize(
    attempts: Iterable[Attempt], by: str, since: float, until: float, now: float
) -> list[Row]:
    """Sums per key over the window, sorted by key. ``by``: project, user (keyed by project
    and user, as sreport's AccountUtilizationByUser) or resource."""
    if by not in BY:
        raise ValueError(f"--by must be one of {', '.join(BY)}, not {by!r}")
    rows: dict[tuple[str, ...], Row] = {}
    for a in attempts:
        end = a.end if a.end is not None else min(until, now)
        used = overlap(a.start, end, since, until)
        lost = 0.0
        if a.preempted and a.end is not None:
            lost = overlap(max(a.start, a.checkpoint or a.start), a.end, since, until)
        if used <= 0 and lost <= 0:
            continue
        for key, resources in _keys(a, by):
            row = rows.setdefault(key, Row(key))
            row.attempts += 1
            row.preempted += int(a.preempted and lost > 0)
            row.add(row.used, resources, used)
            if a.borrowed:
                row.add(row.borrowed, resources, used)
            if lost:
                row.add(row.lost, resources, lost)
    return [rows[k] for k in sorted(rows)]


def _keys(a: Attempt, by: str) -> list[tuple[tuple[str, ...], Mapping[str, int]]]:
    if by == "project":
        return [((a.project,), a.resources)]
    if by == "user":
        return [((a.project, a.user), a.resources)]
    return [((resource,), {resource: count}) for resource, count in sorted(a.resources.items())]


def window_start(now: float, days: float) -> float:
    return now - days * DAY_SECONDS
