"""The quota file: pool (in tiers), project membership, fractional shares, scheduling knobs.

AXLearn's schema version "1" loads unchanged; ``[scheduling]`` is our optional addition.
Parsing is pure (text in, config out) and collects *every* problem before raising, so an admin
fixes a file in one round instead of one error per upload.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import re2

SCHEMA_VERSION = "1"
_TABLES = (
    "toml-schema",
    "total_resources",
    "project_membership",
    "project_resources",
    "scheduling",
)


class QuotaError(ValueError):
    """An invalid quota file; ``problems`` lists each one with its file, key and fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class SchedulingKnobs:
    """Policy knobs from the optional ``[scheduling]`` table (all seconds)."""

    min_runtime_seconds: float = 300.0  # a running job is not preempted before this
    preemption_grace_seconds: float = 60.0  # SIGTERM -> SIGKILL on preemption
    usage_half_life_seconds: float = 7 * 86400.0  # decay of the usage that orders users
    preempt_within_project: bool = False  # higher priority may preempt lower, same project
    # The oldest job that has waited this long and fits its project's quota blocks the later
    # jobs of its project until it starts: small jobs cannot keep a large one out forever.
    reserve_after_seconds: float = 1800.0
    # A within-quota job preempts others only once its project has waited this long (at
    # most min_runtime_seconds, so the promise of one reclaim period holds as before):
    # capacity that frees by itself meanwhile, as jobs finish, spares the preemptions.
    reclaim_after_seconds: float = 240.0

    @property
    def reclaim_delay_seconds(self) -> float:
        """How long a within-quota job waits before it preempts (see reclaim_after_seconds)."""
        return min(self.reclaim_after_seconds, self.min_runtime_seconds)

    @property
    def reclaim_period_seconds(self) -> float:
        """Longest a within-quota job waits for borrowers: min runtime plus grace."""
        return self.min_runtime_seconds + self.preemption_grace_seconds


@dataclass(frozen=True)
class QuotaConfig:
    """A validated quota file. Shares are normalised per resource type (they sum to 1)."""

    tiers: tuple[Mapping[str, int], ...]
    membership: Mapping[str, tuple[str, ...]]
    shares: Mapping[str, Mapping[str, float]]
    scheduling: SchedulingKnobs = field(default_factory=SchedulingKnobs)
    notes: tuple[str, ...] = ()  # non-fatal remarks for `bastion quota check`

    @property
    def pool(self) -> dict[str, int]:
        """Total capacity per resource type, summed over tiers."""
        total: dict[str, int] = {}
        for tier in self.tiers:
            for r, n in tier.items():
                total[r] = total.get(r, 0) + n
        return total

    @cached_property
    def quotas(self) -> dict[str, dict[str, float]]:
        """Absolute guaranteed units of every project with a share (cached; config is frozen)."""
        pool = self.pool
        return {
            p: {r: f * pool[r] for r, f in s.items() if r in pool} for p, s in self.shares.items()
        }

    def quota_of(self, project_id: str) -> dict[str, float]:
        """Absolute guaranteed units per resource type (empty: best effort only)."""
        return dict(self.quotas.get(project_id, {}))

    @cached_property
    def _patterns(self) -> dict[str, tuple[Any, ...]]:
        return {p: tuple(compile_membership(x) for x in xs) for p, xs in self.membership.items()}

    def projects_of(self, user_id: str) -> list[str]:
        """Projects whose membership regexes fully match the user id, sorted."""
        return sorted(
            p for p, pats in self._patterns.items() if any(x.fullmatch(user_id) for x in pats)
        )

    @cached_property
    def _members(self) -> dict[tuple[str, str], bool]:
        return {}

    def is_member(self, user_id: str, project_id: str) -> bool:
        """Full match of the user id on one of the project's regexes (memoised: the daemon
        asks about the same users every cycle)."""
        key = (user_id, project_id)
        hit = self._members.get(key)
        if hit is None:
            if len(self._members) > 100_000:
                self._members.clear()
            hit = self._members[key] = any(
                x.fullmatch(user_id) for x in self._patterns.get(project_id, ())
            )
        return hit


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the error comes back to us; RE2 would also print it to stderr
    return options


_RE2_OPTIONS = _re2_options()


def compile_membership(pattern: str) -> Any:
    """A membership pattern compiled with RE2: matching is linear in the user id's length.

    Python's ``re`` backtracks: ``(a+)+$`` against 30 ``a`` and a ``!`` takes minutes, and the
    daemon matches user ids every cycle, so one such line in the quota file froze it past its
    lease. RE2 refuses what needs backtracking (backreferences, lookaround); raises re2.error.
    Matches are still full matches of the user id (``fullmatch``), as with ``re`` before."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


def default_quota(pool: Mapping[str, int]) -> QuotaConfig:
    """The config used when no quota file exists: everyone in one project with the whole pool."""
    return QuotaConfig(
        tiers=(dict(pool),),
        membership={"default": (".*",)},
        shares={"default": {r: 1.0 for r in pool}},
    )


def parse_quota(text: str, source: str = "<quota>") -> QuotaConfig:
    """Parse and validate a quota file; raise QuotaError listing every problem."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise QuotaError([f"{source}: TOML syntax error: {e}; fix the syntax at that line"]) from e
    p = _Problems(source)
    for key in doc:
        if key not in _TABLES:
            p.add(f"[{key}]", "unknown table", f"remove it or use one of {_fmt_list(_TABLES)}")
    _check_schema(doc, p)
    tiers = _parse_tiers(doc, p)
    membership = _parse_membership(doc, p)
    raw_shares = _parse_shares(doc, p)
    knobs = _parse_knobs(doc, p)
    if p.problems:
        raise QuotaError(p.problems)
    config = QuotaConfig(
        tiers=tiers, membership=membership, shares=_normalise(raw_shares), scheduling=knobs
    )
    return QuotaConfig(
        tiers=tiers,
        membership=membership,
        shares=config.shares,
        scheduling=knobs,
        notes=tuple(_notes(config, raw_shares)),
    )


class _Problems:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def add(self, where: str, what: str, fix: str) -> None:
        self.problems.append(f"{self.source}: {where}: {what}; fix: {fix}")


def _fmt_list(xs: Any) -> str:
    return ", ".join(str(x) for x in xs) or "(none)"


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check_schema(doc: dict[str, Any], p: _Problems) -> None:
    schema = doc.get("toml-schema")
    fix = f'start the file with [toml-schema] and version = "{SCHEMA_VERSION}"'
    if not isinstance(schema, dict):
        p.add("[toml-schema]", "missing" if schema is None else "must be a table", fix)
        return
    for key in schema:
        if key != "version":
            p.add(f"[toml-schema] {key}", "unknown key", "remove it (only 'version' is allowed)")
    version = schema.get("version")
    if version != SCHEMA_VERSION:
        p.add("[toml-schema] version", f"unsupported version {version!r}", fix)


def _parse_tiers(doc: dict[str, Any], p: _Problems) -> tuple[dict[str, int], ...]:
    raw = doc.get("total_resources")
    if raw is None:
        p.add("[total_resources]", "missing", "add [total_resources] with e.g. v4 = 1024")
        return ()
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        p.add(
            "[total_resources]",
            "must be one table or a list of [[total_resources]] tables",
            "write [total_resources] with v4 = 1024, or one [[total_resources]] per tier",
        )
        return ()
    tiers = []
    for i, table in enumerate(raw):
        where = "[total_resources]" if len(raw) == 1 else f"[[total_resources]] tier {i}"
        tier: dict[str, int] = {}
        for r, n in table.items():
            if isinstance(n, float) and n.is_integer():
                n = int(n)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                p.add(
                    f"{where} {r}", f"must be a whole number >= 0, got {n!r}", f"write e.g. {r} = 8"
                )
                continue
            tier[r] = n
        tiers.append(tier)
    return tuple(tiers)


def _parse_membership(doc: dict[str, Any], p: _Problems) -> dict[str, tuple[str, ...]]:
    raw = doc.get("project_membership", {})
    if not isinstance(raw, dict):
        p.add("[project_membership]", "must be a table", 'write [project_membership] p1 = ["u1"]')
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for project, members in raw.items():
        where = f"[project_membership] {project}"
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            p.add(
                where,
                f"must be a list of regular expressions, got {members!r}",
                f'write {project} = ["user1", "team-.*"]',
            )
            continue
        for i, m in enumerate(members):
            try:
                compile_membership(m)
            except re2.error as e:
                err = e.args[0].decode(errors="replace") if e.args else str(e)
                shown = repr(m) if len(m) <= 80 else f"{m[:80]!r}…({len(m)} characters)"
                p.add(
                    f"{where}[{i}]",
                    f"regular expression {shown} cannot be used ({err})",
                    _pattern_fix(err),
                )
        out[project] = tuple(members)
    return out


def _pattern_fix(err: str) -> str:
    """What to write instead: RE2 (linear time) has no backreferences or lookaround."""
    if "perl operator" in err or ("escape sequence: \\" in err and err[-1:].isdigit()):
        return (
            "rewrite it without backreferences or lookaround (RE2 syntax, which matches "
            'in linear time), e.g. list the alternatives: "alice|bob|team-.*"'
        )
    if "\\Z" in err:
        return "write $ instead of \\Z (the pattern must match the whole user id anyway)"
    return "escape special characters or fix the pattern (RE2 syntax)"


def _parse_shares(doc: dict[str, Any], p: _Problems) -> dict[str, dict[str, float]]:
    raw = doc.get("project_resources", {})
    if not isinstance(raw, dict):
        p.add(
            "[project_resources]",
            "must be a table of project tables",
            "write [project_resources.p1] with v4 = 0.5",
        )
        return {}
    out: dict[str, dict[str, float]] = {}
    for project, table in raw.items():
        if not isinstance(table, dict):
            p.add(
                f"[project_resources] {project}",
                f"must be a table, got {table!r}",
                f"write [project_resources.{project}] with one fraction per resource type",
            )
            continue
        fracs: dict[str, float] = {}
        for r, f in table.items():
            where = f"[project_resources.{project}] {r}"
            if not _is_number(f):
                p.add(where, f"fraction must be a number, got {f!r}", f"write e.g. {r} = 0.5")
            elif f < 0:
                p.add(where, f"fraction must be >= 0, got {f}", f"write e.g. {r} = 0.5")
            else:
                fracs[r] = float(f)
        out[project] = fracs
    return out


def _parse_knobs(doc: dict[str, Any], p: _Problems) -> SchedulingKnobs:
    raw = doc.get("scheduling", {})
    if not isinstance(raw, dict):
        p.add("[scheduling]", "must be a table", "write [scheduling] min_runtime_seconds = 300")
        return SchedulingKnobs()
    known = {f.name: f for f in fields(SchedulingKnobs)}
    values: dict[str, Any] = {}
    for key, v in raw.items():
        where = f"[scheduling] {key}"
        if key not in known:
            p.add(where, "unknown key", f"use one of {_fmt_list(known)}")
        elif key == "preempt_within_project":
            if isinstance(v, bool):
                values[key] = v
            else:
                p.add(where, f"must be true or false, got {v!r}", f"write {key} = false")
        elif not _is_number(v) or v < 0:
            p.add(where, f"must be a number of seconds >= 0, got {v!r}", f"write {key} = 300")
        elif key == "usage_half_life_seconds" and v == 0:
            p.add(where, "must be > 0", f"write {key} = 604800 (7 days)")
        else:
            values[key] = float(v)
    return SchedulingKnobs(**values)


def _normalise(raw: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    totals: dict[str, float] = {}
    for fracs in raw.values():
        for r, f in fracs.items():
            totals[r] = totals.get(r, 0.0) + f
    return {
        p: {r: (f / totals[r] if totals[r] > 0 else 0.0) for r, f in fracs.items()}
        for p, fracs in raw.items()
    }


def _notes(config: QuotaConfig, raw: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Things that are legal (AXLearn accepts them) but probably not what the admin meant."""
    notes = []
    pool = config.pool
    totals: dict[str, float] = {}
    for project, fracs in raw.items():
        if project not in config.membership:
            notes.append(
                f"project {project} has a share but no [project_membership] entry: "
                "nobody can submit to it (others may borrow its quota)"
            )
        for r, f in fracs.items():
            totals[r] = totals.get(r, 0.0) + f
            if r not in pool:
                notes.append(
                    f"[project_resources.{project}] {r}: not in [total_resources], ignored"
                )
    for r, total in sorted(totals.items()):
        if r in pool and total > 0 and not math.isclose(total, 1.0):
            notes.append(f"fractions of {r} sum to {total:g}; normalised to 1")
    return notes
