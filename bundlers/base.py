"""The bundle contract: a source directory in, an immutable, content-addressed record out.

A job must run the code the user launched, byte for byte, on every attempt (a retry after a
preemption included), so a spec stores a :class:`Bundle` record naming content by digest, never a
mutable name (AXLearn's ``:<job>`` tags and overwritten tarballs are the gap this closes; see
Google's API documentation). The client finds bundlers by kind in its registry
(``launch.bundling.BUNDLERS``) with lazy imports, as the daemon finds runners, so the Docker SDK
or googleapiclient cost nothing until a launch asks for that bundler.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


class BundleError(Exception):
    """A bundle cannot be made or used; the message is for the user: it names the file, the
    flag or the digest, and says what to do about it."""


@dataclass(frozen=True)
class Bundle:
    """What a job spec stores to rerun the exact code: enough to fetch and verify it.

    ``digest`` is ``sha256:<hex>`` of the stored object itself (the .tar.gz, or the pushed
    image's manifest), so whoever fetches it can check what it got against the spec."""

    kind: str  # "tar", "docker", "cloudbuild"
    uri: str  # gs://ROOT/bundles/sha256-<hex>.tar.gz, or REGISTRY/IMAGE@sha256:<hex>
    digest: str  # "sha256:<hex>"
    size: int  # bytes of the stored object
    git_commit: str | None = None
    git_dirty: bool | None = None  # None: not a git work tree (or git is not installed)
    created: float = field(default_factory=time.time)  # not part of the digest

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | bytes) -> Bundle:
        """From a dict or its JSON text; unknown keys (a newer writer's) are ignored."""
        if isinstance(data, str | bytes):
            data = json.loads(data)
        if not isinstance(data, Mapping):
            raise BundleError(f"a bundle record must be a JSON object, not {type(data).__name__}")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        missing = {"kind", "uri", "digest", "size"} - known.keys()
        if missing:
            raise BundleError(f"the bundle record lacks {', '.join(sorted(missing))}: {data}")
        return cls(**known)


class Bundler(abc.ABC):
    kind: str = ""

    @abc.abstractmethod
    def bundle(
        self, source_dir: str, store: Any, options: Mapping[str, Any], dry_run: bool = False
    ) -> Bundle:
        """Make (or find already made) the bundle of ``source_dir``; ``store``: the root's
        bastion.bucket.store.Store; ``options``: the ``--bundler_spec`` keys; ``dry_run``: build
        what is needed for the record, upload and push nothing."""


def parse_spec_options(items: Iterable[str]) -> dict[str, str]:
    """AXLearn's repeated ``--bundler_spec=key=value`` into a dict (a later key wins)."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BundleError(
                f"--bundler_spec={item} is not key=value (for example --bundler_spec=exclude=data/)"
            )
        options[key.strip()] = value
    return options


def with_excludes(options: Mapping[str, Any], excludes: Iterable[str]) -> dict[str, Any]:
    """Add ``--bundler_exclude`` values to the spec's ``exclude`` option (comma-separated)."""
    merged = dict(options)
    parts = [p for p in str(merged.get("exclude") or "").split(",") if p.strip()]
    parts += [e for e in excludes if e.strip()]
    if parts:
        merged["exclude"] = ",".join(parts)
    return merged


def format_size(size: int) -> str:
    """1536 -> "1.5 KiB": sizes in messages (bundle and object limits), in binary units as the
    limits are."""
    if size < 1024:
        return f"{size} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:.1f}".removesuffix(".0") + f" {unit}"
    raise AssertionError("unreachable")
