"""Where the usage ledger and the status page live in the bucket: ``ROOT/usage/`` and
``ROOT/status/``.

A small namespace composed into ``Store`` (``store.reports``), so the store stays the only code
that knows bucket paths without the big class growing a method per object. It goes through the
store's counted primitives, so its requests show in ``Store.ops`` like every other.

Layout::

    ROOT/usage/<YYYY-MM-DD>/<session>.jsonl   one object per UTC day per daemon session,
                                              appended to as attempts start and end
    ROOT/usage/prices.toml                    an optional price table (bastion usage)
    ROOT/status/index.html                    the status page (static: HTML, inline SVG, CSS)
    ROOT/status/status.json                   the same data, for tools
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bastion.bucket.store import Store

USAGE, STATUS, LOGS = "usage", "status", "logs"  # (logs/: the store's; linked to here)
PAGE, PAGE_DATA = "index.html", "status.json"
PAGE_OP = "status_page"
PRICES = "prices.toml"  # the page's writes in Store.ops
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_SESSION = re.compile(r"^[0-9a-f]{8,32}\.jsonl$")


def log_url(root_url: str, name: str, relative: bool) -> str:
    """Where a job's log object (``ROOT/logs/NAME``) is, for a link on the status page:
    beside the page in the bucket (``../logs/NAME``, which works from file://, a static
    website or an authenticated URL alike), else absolute (a page written elsewhere)."""
    quoted = urllib.parse.quote(name, safe="")
    if relative:
        return f"../{LOGS}/{quoted}"
    scheme, _, rest = root_url.partition("://")
    if scheme in ("gs", "gcs"):
        return f"https://storage.cloud.google.com/{rest.strip('/')}/{LOGS}/{quoted}"
    if scheme == "s3":
        bucket, _, path = rest.partition("/")
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        return f"https://{bucket}.s3.amazonaws.com/{prefix}{LOGS}/{quoted}"
    path = rest if scheme in ("file", "local") else root_url
    return "file://" + urllib.parse.quote(path.rstrip("/")) + f"/{LOGS}/{quoted}"


class ReportObjects:
    """The usage ledger's objects and the status page's, through ``store``'s primitives."""

    def __init__(self, store: Store) -> None:
        self._store = store

    # -- the usage ledger ------------------------------------------------------------------

    @staticmethod
    def ledger_object(session: str) -> str:
        return f"{session}.jsonl"

    def append_usage(self, day: str, session: str, data: bytes, size: int | None) -> None:
        """Add lines to this session's object of ``day``; ``size`` is what this session wrote
        to it so far (0: not yet; None: unknown), which saves a request per append on GCS."""
        if not _DAY.match(day):
            raise ValueError(f"usage day {day!r} is not YYYY-MM-DD")
        self._store.bucket.append(data, USAGE, day, self.ledger_object(session), size=size)

    def usage_index(self) -> dict[str, list[str]]:
        """The ledger's objects by day, oldest day first: one recursive listing (GCS lists no
        "directories" under a delimiter, and a ledger has one object per day and session).
        Anything else under ROOT/usage/ is ignored."""
        self._store.bucket.count("list")
        index: dict[str, list[str]] = {}
        for name in self._store.objects.find(self._store.bucket.path(USAGE)):
            day, _, obj = name.partition("/")
            if _DAY.match(day) and _SESSION.match(obj):
                index.setdefault(day, []).append(obj)
        return {day: sorted(index[day]) for day in sorted(index)}

    def usage_days(self) -> list[str]:
        return list(self.usage_index())

    def read_usage_object(self, day: str, name: str) -> bytes:
        return self._store.bucket.read(USAGE, day, name) or b""

    def usage_url(self) -> str:
        return self._store.bucket.url(USAGE)

    def prices_url(self) -> str:
        """The root's price table (optional), read by ``bastion usage`` without --prices."""
        return self._store.bucket.url(USAGE, PRICES)

    # -- the status page -------------------------------------------------------------------

    def write_page(self, html: bytes, data: dict[str, Any]) -> None:
        """The data first, then the page: a reader of both never sees a page newer than
        its data. Counted as PAGE_OP, not as writes: the page is written by a background
        thread at any moment, and a cycle's own writes must stay measurable."""
        for raw, name in ((json.dumps(data, sort_keys=True).encode(), PAGE_DATA), (html, PAGE)):
            self._store.bucket.count(PAGE_OP)
            self._store.objects.write(self._store.bucket.path(STATUS, name), raw)

    def read_page(self) -> bytes | None:
        return self._store.bucket.read(STATUS, PAGE)

    def read_page_data(self) -> dict[str, Any] | None:
        raw = self._store.bucket.read(STATUS, PAGE_DATA)
        return json.loads(raw) if raw else None

    def log_link(self, name: str, relative: bool = True) -> str:
        return log_url(self._store.root_url, name, relative)

    def page_url(self) -> str:
        return self._store.bucket.url(STATUS, PAGE)
