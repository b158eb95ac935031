"""``bastion usage``: resource-hours per project, user or resource type from the ledger.

Times on the command line: a duration back from now (``90s``, ``30m``, ``12h``, ``7d``), a
UTC date (``2026-11-20``) or a UTC time (``2026-11-20T10:00``, ``2026-11-20T10:00:00``), or
seconds since the epoch. Prices: a TOML file with a ``[prices]`` table of cost per
resource-hour (``gpu = 2.5``) and an optional ``currency``.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from bastion.bucket.store import Store
from bastion.usage.report import BY, Row, read_attempts, summarize

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")
PRICE_FIX = 'write [prices] with a number per resource-hour, e.g. gpu = 2.5 (and currency = "USD")'


class UsageInputError(ValueError):
    """A bad --since/--until/--by/--prices: one line naming the flag or file, and the fix."""


def parse_when(flag: str, text: str, now: float) -> float:
    """A duration back from ``now``, a UTC date or time, or epoch seconds."""
    text = text.strip()
    m = _DURATION.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    for fmt in _FORMATS:
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.UTC).timestamp()
        except ValueError:
            continue
    try:
        return float(text)
    except ValueError:
        raise UsageInputError(
            f"--{flag}={text!r} is not a time; give a duration back from now (90s, 30m, 12h, "
            "7d), a UTC date (2026-11-20), a UTC time (2026-11-20T10:00) or epoch seconds"
        ) from None


def window(since: str, until: str | None, now: float) -> tuple[float, float]:
    start = parse_when("since", since, now)
    end = parse_when("until", until, now) if until else now
    if end <= start:
        raise UsageInputError(
            f"--until ({_stamp(end)}) is not after --since ({_stamp(start)}); "
            "give an --until later than --since, or leave it out for now"
        )
    return start, end


def load_prices(store: Store, url: str) -> tuple[dict[str, float], str]:
    """The price table at ``url`` (a path or a bucket URL): {resource: per hour}, currency."""
    try:
        text = store.quota.read(url).decode()
    except FileNotFoundError:
        raise UsageInputError(f"--prices: no file at {url}; fix the path or leave it out") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageInputError(f"--prices: cannot read {url}: {e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageInputError(f"--prices: {url} is not TOML ({e}); {PRICE_FIX}") from None
    table = doc.get("prices")
    if not isinstance(table, dict) or not table:
        raise UsageInputError(f"--prices: {url} has no [prices] table; {PRICE_FIX}")
    prices = {}
    for resource, price in table.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            raise UsageInputError(
                f"--prices: {url}: prices.{resource} = {price!r} is not a price; give a "
                f"number >= 0 per {resource}-hour, e.g. {resource} = 2.5"
            )
        prices[str(resource)] = float(price)
    unknown = sorted(set(doc) - {"prices", "currency"})
    if unknown:
        raise UsageInputError(
            f"--prices: {url}: unknown key(s) {', '.join(unknown)}; only [prices] and "
            "currency are read: remove them"
        )
    currency = doc.get("currency", "")
    if not isinstance(currency, str):
        raise UsageInputError(f'--prices: {url}: currency must be a string, e.g. "USD"')
    return prices, currency


def report(store: Store, by: str, since: float, until: float, now: float) -> list[Row]:
    if by not in BY:
        raise UsageInputError(f"--by={by!r}: give one of {', '.join(BY)}")
    return summarize(read_attempts(store, since, until).values(), by, since, until, now)


def key_names(by: str) -> tuple[str, ...]:
    return ("project", "user") if by == "user" else (by,)


def to_json(
    rows: Sequence[Row], by: str, since: float, until: float, prices: Mapping[str, float] | None
) -> dict[str, Any]:
    """Figures in resource-seconds (exact) and resource-hours."""
    out = []
    for row in rows:
        item: dict[str, Any] = dict(zip(key_names(by), row.key, strict=True))
        item.update(attempts=row.attempts, preempted_attempts=row.preempted)
        for what in ("used", "borrowed", "lost"):
            seconds = getattr(row, what)
            item[f"{what}_resource_seconds"] = {r: round(s, 3) for r, s in sorted(seconds.items())}
            item[f"{what}_resource_hours"] = {r: s / 3600 for r, s in sorted(seconds.items())}
        cost = row.cost(prices)
        if cost is not None:
            item["cost"] = round(cost, 6)
        out.append(item)
    return {"by": by, "since": since, "until": until, "rows": out}


def _resource_lines(row: Row) -> list[tuple[str, float, float, float]]:
    return [
        (r, row.used.get(r, 0.0), row.borrowed.get(r, 0.0), row.lost.get(r, 0.0))
        for r in sorted(set(row.used) | set(row.lost))
    ]


def to_csv(rows: Sequence[Row], by: str, prices: Mapping[str, float] | None) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    head = [*key_names(by), "resource", "used_hours", "borrowed_hours", "lost_to_preemption_hours"]
    writer.writerow([*head, "attempts", "preempted_attempts"] + (["cost"] if prices else []))
    for row in rows:
        for resource, used, borrowed, lost in _resource_lines(row):
            cost = [f"{prices.get(resource, 0.0) * used / 3600:.6f}"] if prices else []
            hours = [f"{used / 3600:.6f}", f"{borrowed / 3600:.6f}", f"{lost / 3600:.6f}"]
            writer.writerow([*row.key, resource, *hours, row.attempts, row.preempted, *cost])
    return buf.getvalue()


def to_table(
    rows: Sequence[Row], by: str, prices: Mapping[str, float] | None, currency: str
) -> str:
    head = [k.upper() for k in key_names(by)]
    head += ["RESOURCE", "USED(h)", "BORROWED(h)", "LOST TO PREEMPTION(h)", "ATTEMPTS"]
    table = [head + (["COST"] if prices else [])]
    for row in rows:
        for resource, used, borrowed, lost in _resource_lines(row):
            line = [*row.key, resource, f"{used / 3600:.3f}", f"{borrowed / 3600:.3f}"]
            line += [f"{lost / 3600:.3f}", f"{row.attempts} ({row.preempted} preempted)"]
            if prices:
                line.append(f"{prices.get(resource, 0.0) * used / 3600:.2f} {currency}".strip())
            table.append(line)
    if len(table) == 1:
        return "no attempts ran in this window"
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) for r in table)


def _stamp(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def header(since: float, until: float) -> str:
    return f"usage from {_stamp(since)} to {_stamp(until)} (from the ledger)"
