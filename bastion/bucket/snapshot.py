"""``history/snapshot/<NN>``: every active job's spec and state in a few compressed shards, so
a restarted daemon (and ``bastion list``, ``why``, ``status --html``) reads 64 objects and the
few specs and states that changed since, instead of two objects per job.

The snapshot is never trusted on its own. Each entry carries the listing tokens of the spec
and the state it was taken from; a reader lists jobs/active/ and jobs/states/ (a page per
1,000 objects) and takes an entry's bytes only where the listed token is the entry's. Any
other object is read as before. So a stale shard, a shard written by a daemon that has since
lost the lease, or one torn or foreign, costs reads, never a wrong state.

A shard is a job's ``crc32(name) % SHARDS``; its object is zlib-compressed:

    bastion-snapshot 1\\n
    then per job: a JSON header line [name, spec token, state token, state bytes, spec bytes]
    followed by that many bytes of the state, then of the spec
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bastion.bucket.counted import CountedObjects
from bastion.bucket.history import HISTORY
from bastion.bucket.objects import ObjectInfo
from bastion.retry import quietly

if TYPE_CHECKING:
    from bastion.bucket.store import Store

SHARDS = 64
SNAPSHOT = "snapshot"
_MAGIC = b"bastion-snapshot 1\n"
_MAX_SHARD_BYTES = 1 << 30  # a shard inflated past this is not ours: read as empty


class SnapshotError(ValueError):
    """A shard that is not a snapshot this code wrote (torn, foreign, another version)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One job as the daemon last wrote it: its state's bytes and listing token, and the spec
    it took in (``spec`` empty and ``spec_token`` "" when it holds none worth keeping)."""

    spec_token: str
    state_token: str
    state: bytes
    spec: bytes = b""


def shard_of(name: str) -> int:
    return zlib.crc32(name.encode()) % SHARDS


def encode(entries: Iterable[tuple[str, Entry]]) -> bytes:
    parts = [_MAGIC]
    for name, e in entries:
        header = [name, e.spec_token, e.state_token, len(e.state), len(e.spec)]
        parts += [json.dumps(header, separators=(",", ":")).encode(), b"\n", e.state, e.spec]
    return zlib.compress(b"".join(parts), 1)


def decode(raw: bytes) -> dict[str, Entry]:
    """A shard's entries; SnapshotError for anything this code did not write."""
    try:
        inflater = zlib.decompressobj()
        data = inflater.decompress(raw, _MAX_SHARD_BYTES)
    except zlib.error as e:
        raise SnapshotError(f"not compressed as a snapshot: {e}") from None
    if not inflater.eof or inflater.unconsumed_tail or not data.startswith(_MAGIC):
        raise SnapshotError("torn, too large, or not a snapshot of this version")
    return dict(_entries(data, len(_MAGIC)))


def _entries(data: bytes, at: int) -> Iterator[tuple[str, Entry]]:
    while at < len(data):
        end = data.find(b"\n", at)
        try:
            name, spec_token, state_token, state_len, spec_len = json.loads(data[at:end])
            state_at = end + 1
            spec_at = state_at + int(state_len)
            at = spec_at + int(spec_len)
        except (ValueError, TypeError) as e:
            raise SnapshotError(f"a torn entry: {e}") from None
        if end < 0 or at > len(data):
            raise SnapshotError("a torn entry")
        state, spec = data[state_at:spec_at], data[spec_at:at]
        yield str(name), Entry(str(spec_token), str(state_token), state, spec)


class Snapshot:
    """``history/snapshot/``: written by the acting daemon, read by it at recovery and by
    every reader of the whole queue."""

    def __init__(self, bucket: CountedObjects) -> None:
        self._bucket = bucket

    def write(self, shard: int, data: bytes) -> None:
        self._bucket.write(data, HISTORY, SNAPSHOT, f"{shard:02d}")

    def read(self, shard: int) -> dict[str, Entry]:
        """A shard's entries; {} when it is absent, or torn or foreign (then every job in it is
        read from its own objects)."""
        raw = self._bucket.read(HISTORY, SNAPSHOT, f"{shard:02d}")
        if not raw:
            return {}
        try:
            return decode(raw)
        except SnapshotError:
            return {}

    def read_all(self, map_: Callable[..., Iterable[object]] = map) -> dict[str, Entry]:
        """Every shard's entries (``map_``: a pool's map, to read them in parallel); a shard
        that cannot be read counts as empty."""
        try:  # one listing first: a root without a snapshot costs one request, not 64
            present = sorted(int(n) for n in self._bucket.list(HISTORY, SNAPSHOT) if n.isdigit())
        except Exception:
            return {}
        entries: dict[str, Entry] = {}
        for shard in map_(self._read_quietly, [s for s in present if s < SHARDS]):
            entries.update(shard)  # type: ignore[call-overload]
        return entries

    def _read_quietly(self, shard: int) -> dict[str, Entry]:
        try:
            return self.read(shard)
        except Exception:  # a failed read costs the reads the shard would have saved
            return {}


def still_current(
    entries: dict[str, Entry], specs: dict[str, ObjectInfo], states: dict[str, ObjectInfo]
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The states and the specs whose listed token is the one an entry was taken from: their
    bytes need no read (pure)."""
    fresh_states: dict[str, bytes] = {}
    fresh_specs: dict[str, bytes] = {}
    for name, entry in entries.items():
        state = states.get(name)
        if state is not None and state.token == entry.state_token:
            fresh_states[name] = entry.state
        spec = specs.get(name)
        if entry.spec and spec is not None and spec.token == entry.spec_token:
            fresh_specs[name] = entry.spec
    return fresh_states, fresh_specs


@dataclass(slots=True)
class ActiveJob:
    """An active job's spec and state as the bucket holds them now: bytes, None (absent) or
    the exception that reading it raised (the reader reports it on that job alone)."""

    name: str
    spec: bytes | Exception | None
    state: bytes | Exception | None


def read_active(store: Store, map_: Callable[..., Iterable[object]] = map) -> list[ActiveJob]:
    """Every job in jobs/active/ with its spec and state, by name: two listings, the snapshot,
    and a read of each spec or state the snapshot does not hold as listed now."""
    specs, states = map_(lambda listing: listing(), [store.specs.list, store.states.list])
    fresh_states, fresh_specs = still_current(store.snapshot.read_all(map_), specs, states)
    names = sorted(specs)
    spec_reads = [n for n in names if n not in fresh_specs]
    state_reads = [n for n in names if n in states and n not in fresh_states]
    read_specs = dict(zip(spec_reads, map_(quietly(store.specs.read), spec_reads), strict=True))
    read_states = dict(zip(state_reads, map_(quietly(store.states.read), state_reads), strict=True))
    return [
        ActiveJob(
            name,
            fresh_specs[name] if name in fresh_specs else read_specs[name],  # type: ignore[arg-type]
            fresh_states.get(name, read_states.get(name)),  # type: ignore[arg-type]
        )
        for name in names
    ]
